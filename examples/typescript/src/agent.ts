// A standing agent in TypeScript: it creates its session, then turn after turn appends the
// user's message, reads the (already compacted) window, "calls the model" (a local stand-in
// that answers and counts tokens the way a provider reports them), reports the usage, and
// appends the reply. sessionfold folds the session in the background once it passes its
// trigger; at the end the agent long-polls until that fold has landed.
//
//   SESSIONFOLD_URL=http://127.0.0.1:8080 SESSIONFOLD_API_KEY=sfk_... node dist/agent.js
//
// Prints one JSON line with what happened; exits 0 once a fold was seen, 1 otherwise.

import { Sessionfold, type Message, type Window } from "./sessionfold.js";

declare const process: { env: Record<string, string | undefined>; exitCode?: number };

const baseUrl = process.env.SESSIONFOLD_URL ?? "http://127.0.0.1:8080";
const apiKey = process.env.SESSIONFOLD_API_KEY;
const sessionId = process.env.SESSION_ID ?? `ts-agent-${Date.now()}`;
const turns = Number(process.env.TURNS ?? "14");
const foldWaitS = Number(process.env.FOLD_WAIT_S ?? "120");

const SYSTEM = "You are an on-call assistant. Keep the incident timeline straight.";
const POLICY = { budget_tokens: 2000, keep_recent_turns: 2 };

/** The stand-in model: a reply, and usage counted as a provider would (about 4 characters a
 *  token, the system prompt included). */
function standInModel(window: Window, turn: number):
    { reply: Message; usage: Record<string, number> } {
  const chars = SYSTEM.length + JSON.stringify(window.messages).length;
  const text = `Step ${turn}: checked host web-${turn} (disk 71%, load 0.4); ` +
    `next I will look at the deploy log of service-${turn} and the alert INC-${4000 + turn}.`;
  return {
    reply: { role: "assistant", content: [{ type: "text", text }] },
    usage: { input_tokens: Math.ceil(chars / 4), output_tokens: Math.ceil(text.length / 4) },
  };
}

async function main(): Promise<void> {
  if (!apiKey) throw new Error("set SESSIONFOLD_API_KEY (sessionfold keys create TENANT)");
  const api = new Sessionfold(baseUrl, apiKey);
  await api.createSession(sessionId, POLICY, SYSTEM);

  let window = await api.window(sessionId);
  for (let turn = 0; turn < turns; turn++) {
    const question: Message = {
      role: "user",
      content: `Turn ${turn}: alert INC-${4000 + turn} fired on web-${turn}; ` +
        `the log says "upstream timed out after 30s" ${"(repeated) ".repeat(20)}`,
    };
    await api.append(sessionId, [question], `turn-${turn}-user`);
    window = await api.window(sessionId);
    const { reply, usage } = standInModel(window, turn);
    await api.reportUsage(sessionId, usage, window.last_seq, window.revision, "stand-in");
    await api.append(sessionId, [reply], `turn-${turn}-assistant`);
  }

  // Wait on the fold by long-poll: no polling loop on our side, the API answers when it lands.
  window = await api.window(sessionId);
  const deadline = Date.now() + foldWaitS * 1000;
  while (window.fold_revision === 0 && Date.now() < deadline) {
    const changed = await api.waitForWindow(sessionId, window.etag, 30, "fold");
    window = changed ?? (await api.window(sessionId));
  }
  const folded = window.fold_revision > 0;
  console.log(JSON.stringify({
    session: sessionId, turns, folded, fold_revision: window.fold_revision,
    revision: window.revision, window_messages: window.messages.length,
    window_kinds: window.items.map((item) => item.kind),
  }));
  process.exitCode = folded ? 0 : 1;
}

main().catch((error: unknown) => {
  console.error(`agent failed: ${error instanceof Error ? error.message : String(error)}`);
  process.exitCode = 2;
});
