// A standing agent in TypeScript on @sessionfold/client: plain Anthropic SDK code, its loop
// unchanged; the four lines marked "sessionfold" are all it takes. Each request goes out as
// sessionfold's guard lets it (under the session's budget, whatever the background folds are
// doing), and the recall tool is offered and answered without the agent knowing of it.
//
//   SESSIONFOLD_URL=http://127.0.0.1:8080 SESSIONFOLD_API_KEY=sfk_... \
//   ANTHROPIC_BASE_URL=http://127.0.0.1:8787 ANTHROPIC_API_KEY=standin node dist/agent.js
//
// (ANTHROPIC_BASE_URL: `sessionfold standin`, the stand-in model, or leave it out for the real
// API.) Prints one JSON line with what happened; exits 0 when the last reply called no tool.

import Anthropic from "@anthropic-ai/sdk";
import { type Message, SessionAnthropic, Sessionfold } from "@sessionfold/client";

const env = process.env;
const SYSTEM = "You reconcile refunds. Read the log page by page; cite ticket ids.";
const TASK = "Reconcile the refunds of ACCT-8842, then give the refund authorization code.";
const TOOLS = [{ name: "read_log", description: "Read one page of the refunds log.",
                 input_schema: { type: "object", properties: { page: { type: "integer" } } } }];
const MAX_STEPS = Number(env.MAX_STEPS ?? "60");

/** The agent's own tool: one page of a long log (about 2,000 tokens). */
function readLog(page: number): string {
  const lines = Array.from({ length: 85 }, (_, i) =>
    `refund REF-${page}-${i} for account ACCT-8842 was settled after review by the billing team;`);
  if (page === 1) lines.splice(40, 0, `refund authorization ${env.PLANTED ?? "RA-7731-QX"};`);
  return `refunds.log page ${page}:\n${lines.join("\n")}`;
}

const sf = new Sessionfold({ baseUrl: env.SESSIONFOLD_URL ?? "http://127.0.0.1:8080",  // sessionfold
                             apiKey: env.SESSIONFOLD_API_KEY ?? "" });
const session = await sf.session(env.SESSION_ID ?? `ts-agent-${Date.now()}`,              // sessionfold
                                 { policy: { budget_tokens: 16_000 }, system: SYSTEM });
const llm = new SessionAnthropic(new Anthropic(), session);                                // sessionfold

const history: Message[] = [{ role: "user", content: TASK }];
let text = "";
for (let step = 0; step < MAX_STEPS; step++) {
  const reply = await llm.messages.create({ model: env.MODEL ?? "claude-sonnet-4-5",
                                            max_tokens: 1024, messages: history, tools: TOOLS });
  history.push({ role: "assistant", content: reply.content });
  const calls = reply.content.filter((block) => block.type === "tool_use");
  if (calls.length === 0) {
    text = reply.content.map((block) => block.text ?? "").join("");
    break;
  }
  history.push({ role: "user", content: calls.map((call) => ({
    type: "tool_result", tool_use_id: call.id,
    content: readLog(Number((call.input as { page?: number }).page ?? 0)) })) });
}

// An app server would wait for the session's next background fold the same way: by long-poll.
let window = await session.window();
const foldWaitS = Number(env.FOLD_WAIT_S ?? "0");
const deadline = Date.now() + foldWaitS * 1000;
while (window.fold_revision === 0 && Date.now() < deadline) {
  window = (await session.waitForWindow(window.etag, 30, "fold")) ?? (await session.window());
}

console.log(JSON.stringify({
  session: session.id, messages: history.length, text, stats: llm.stats,  // sessionfold
  fold_revision: window.fold_revision, window_kinds: window.items.map((item) => item.kind),
}));
process.exitCode = text ? 0 : 1;
