// SessionOpenAI over a real `sessionfold serve`, the official SDK calling the stand-in model's
// chat completions.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import OpenAI from "openai";

import {
  type ChatToolCall,
  HistoryMismatchError,
  type Message,
  RECALL_TOOL_NAME,
  Sessionfold,
  SessionOpenAI,
} from "../src/index.js";
import { Api, sessionId, StandIn } from "./harness.js";

const SYSTEM = "You reconcile refunds. Cite ticket ids.";
const TASK = "Reconcile the refunds of ACCT-8842.";
const TOOLS = [{ type: "function", function: {
  name: "read_log", description: "Read one page of the refunds log.",
  parameters: { type: "object", properties: { page: { type: "integer" } } } } }];

let api: Api;
let sf: Sessionfold;

before(async () => {
  api = await Api.start();
  sf = new Sessionfold({ baseUrl: api.url, apiKey: api.key });
});
after(async () => api.stop());

function sdk(standIn: StandIn): OpenAI {
  return new OpenAI({ apiKey: "standin", baseURL: `${standIn.url}/v1`, maxRetries: 0 });
}

function answer(call: ChatToolCall): Message {
  const { page } = JSON.parse(call.function.arguments) as { page: number };
  return { role: "tool", tool_call_id: call.id, content: `refunds.log page ${page}: REF-${page} ok` };
}

test("a reply mixing recall with the agent's tools gets its recall answers sent along", async () => {
  const standIn = await StandIn.start([
    { tool_calls: [{ name: "read_log", input: { page: 1 } },
                   { name: RECALL_TOOL_NAME, input: { query: "ACCT-8842" } }] },
    "ACCT-8842: REF-1 is reconciled."]);
  try {
    const session = await sf.session(sessionId("mixed"), {
      policy: { budget_tokens: 16000, recall_offer: "always" }, system: SYSTEM });
    const llm = new SessionOpenAI(sdk(standIn), session);
    const history: Message[] = [{ role: "system", content: SYSTEM }, { role: "user", content: TASK }];
    const first = await llm.chat.completions.create({ model: "gpt-x", messages: history,
                                                      tools: TOOLS });
    const message = first.choices[0]!.message;
    assert.equal(message.tool_calls?.length, 2);
    assert.deepEqual(llm.stats.recall, { served: 1 });
    history.push(message);
    // The agent answers its own tool only; the wrapper adds the recall answer.
    const own = message.tool_calls!.filter((c) => c.function.name === "read_log");
    history.push(...own.map(answer));
    const second = await llm.chat.completions.create({ model: "gpt-x", messages: history,
                                                       tools: TOOLS });
    assert.equal(second.choices[0]!.message.content, "ACCT-8842: REF-1 is reconciled.");
    const window = await session.window({ shape: "openai" });
    const results = window.messages.filter((m) => m.role === "tool");
    assert.equal(results.length, 2);
    assert.match(String(results[1]!.content), /ACCT-8842/);
  } finally {
    await standIn.stop();
  }
});

test("a streamed completion is the final reply's, its recall rounds out of sight", async () => {
  const standIn = await StandIn.start([
    { tool_calls: [{ name: RECALL_TOOL_NAME, input: { query: "ACCT-8842" } }] },
    "Streamed: ACCT-8842 is reconciled.",
    { tool_calls: [{ name: "read_log", input: { page: 2 } }] }]);
  try {
    const session = await sf.session(sessionId("stream"), {
      policy: { budget_tokens: 16000, recall_offer: "always" }, system: SYSTEM });
    const llm = new SessionOpenAI(sdk(standIn), session);
    const history: Message[] = [{ role: "user", content: TASK }];
    const stream = await llm.chat.completions.create({ model: "gpt-x", messages: history,
                                                       stream: true });
    let text = "";
    let usageChunks = 0;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? "";
      if (chunk.usage) usageChunks += 1;
    }
    assert.equal(text, "Streamed: ACCT-8842 is reconciled.");
    assert.equal(usageChunks, 0, "the usage chunk only when the caller asks for it");
    assert.equal(llm.stats.recallRounds, 1);
    history.push(await stream.message());

    history.push({ role: "user", content: "Read page 2." });
    const called = await llm.chat.completions.create({
      model: "gpt-x", messages: history, tools: TOOLS, stream: true,
      stream_options: { include_usage: true } });
    const chunks = [];
    for await (const chunk of called) chunks.push(chunk);
    assert.ok(chunks.at(-1)?.usage, "asked for: the usage chunk comes last");
    const message = await called.message();
    assert.equal(message.tool_calls?.[0]?.function.name, "read_log");
    assert.equal((await session.info()).ledger_len, 6);  // task, recall exchange, reply, ask, call
  } finally {
    await standIn.stop();
  }
});

test("a system message that is not the session's is refused before anything is sent",
     async () => {
  const standIn = await StandIn.start();
  try {
    const session = await sf.session(sessionId("system"), {
      policy: { budget_tokens: 16000 }, system: SYSTEM });
    const llm = new SessionOpenAI(sdk(standIn), session);
    await assert.rejects(llm.chat.completions.create({ model: "gpt-x", messages: [
      { role: "system", content: "Another prompt." }, { role: "user", content: TASK }] }),
    HistoryMismatchError);
    assert.equal((await session.info()).ledger_len, 0);
  } finally {
    await standIn.stop();
  }
});
