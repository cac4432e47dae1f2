// SessionAnthropic over a real `sessionfold serve`, the official SDK calling the stand-in model.

import Anthropic from "@anthropic-ai/sdk";
import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import {
  ApiError,
  HistoryMismatchError,
  RECALL_TOOL_NAME,
  type AnthropicMessage,
  type Message,
  SessionAnthropic,
  Sessionfold,
} from "../src/index.js";
import { Api, sessionId, StandIn } from "./harness.js";

const SYSTEM = "You reconcile refunds. Cite ticket ids.";
const TASK = "Reconcile the refunds of ACCT-8842.";
const TOOLS = [{ name: "read_log", description: "Read one page of the refunds log.",
                 input_schema: { type: "object", properties: { page: { type: "integer" } } } }];

let api: Api;
let sf: Sessionfold;

before(async () => {
  api = await Api.start();
  sf = new Sessionfold({ baseUrl: api.url, apiKey: api.key });
});
after(async () => api.stop());

function page(n: number, words = 300): string {
  return `refunds.log page ${n}: ` + Array.from({ length: words }, (_, i) => `REF-${n}-${i} ok`)
    .join(" ");
}

function sdk(standIn: StandIn): Anthropic {
  return new Anthropic({ apiKey: "standin", baseURL: standIn.url, maxRetries: 0 });
}

/** The agent's own loop, plain SDK code: call, run the tools asked for, until a reply calls
 *  none. */
async function runAgent(llm: SessionAnthropic, history: Message[]): Promise<AnthropicMessage> {
  for (;;) {
    const reply = await llm.messages.create({ model: "claude-x", max_tokens: 512,
                                              messages: history, tools: TOOLS });
    history.push({ role: "assistant", content: reply.content });
    const calls = reply.content.filter((b) => b.type === "tool_use");
    if (calls.length === 0) return reply;
    history.push({ role: "user", content: calls.map((c) => ({
      type: "tool_result", tool_use_id: c.id,
      content: page(Number((c.input as { page: number }).page)) })) });
  }
}

test("a tool loop stays under its budget and every message is recorded once", async () => {
  const run = [...[1, 2, 3, 4, 5, 6].map((n) => ({ tool_calls: [{ name: "read_log",
                                                                 input: { page: n } }] })),
               "Every refund of ACCT-8842 is reconciled."];
  const standIn = await StandIn.start([...run, ...run]);
  try {
    // cap (the default) folds the late window inline; shrink sends the guard's shrink of each
    // request alone and leaves the stored window as it is.
    for (const overBudget of ["cap", "shrink"] as const) {
      const session = await sf.session(sessionId(`loop-${overBudget}`), {
        policy: { budget_tokens: 3000, keep_recent_turns: 1 }, system: SYSTEM });
      const llm = new SessionAnthropic(sdk(standIn), session, { overBudget });
      const history: Message[] = [{ role: "user", content: TASK }];
      const reply = await runAgent(llm, history);

      assert.equal(reply.content[0]?.text, "Every refund of ACCT-8842 is reconciled.");
      const info = await session.info();
      assert.equal(info.ledger_len, history.length);  // each message once, the replies included
      const stats = llm.stats;
      assert.equal(stats.requests, 7);
      assert.ok(stats.largestRequestTokens <= 3000 * 0.95, JSON.stringify(stats));
      if (overBudget === "cap") {
        assert.ok(stats.inlineFolds > 0 && info.fold_revision > 0, JSON.stringify(stats));
      } else {
        // Six pages of ~900 tokens do not fit 3,000 tokens: each request shrunk on its own.
        assert.ok(stats.shrunk > 0 && stats.inlineFolds === 0, JSON.stringify(stats));
        assert.ok((await session.window()).tokens > 3000, "the stored window is untouched");
      }
    }
  } finally {
    await standIn.stop();
  }
});

test("a recall-only reply is answered out of the agent's sight", async () => {
  const standIn = await StandIn.start([
    { tool_calls: [{ name: RECALL_TOOL_NAME, input: { query: "ACCT-8842" } }] },
    "Found it: ACCT-8842."]);
  try {
    const session = await sf.session(sessionId("recall"), {
      policy: { budget_tokens: 16000, recall_offer: "always" }, system: SYSTEM });
    const llm = new SessionAnthropic(sdk(standIn), session);
    const history: Message[] = [{ role: "user", content: TASK }];
    const reply = await llm.messages.create({ model: "claude-x", max_tokens: 256,
                                              messages: history });
    assert.equal(reply.content[0]?.text, "Found it: ACCT-8842.");
    assert.equal(llm.stats.requests, 2);
    assert.equal(llm.stats.recallRounds, 1);
    assert.deepEqual(llm.stats.recall, { served: 1 });
    // The task, the recall exchange the API appended, and the reply.
    assert.equal((await session.info()).ledger_len, 4);

    history.push({ role: "assistant", content: reply.content });
    history.push({ role: "user", content: "Thanks." });
    await llm.messages.create({ model: "claude-x", max_tokens: 256, messages: history });
    assert.equal((await session.info()).ledger_len, 6);
  } finally {
    await standIn.stop();
  }
});

test("a stream is the final reply's, its recall rounds out of sight", async () => {
  const standIn = await StandIn.start([
    { tool_calls: [{ name: RECALL_TOOL_NAME, input: { query: "ACCT-8842" } }] },
    "Streamed: ACCT-8842 is reconciled.",
    { text: "Reading page 1.", tool_calls: [{ name: "read_log", input: { page: 1 } }] }]);
  try {
    const session = await sf.session(sessionId("stream"), {
      policy: { budget_tokens: 16000, recall_offer: "always" }, system: SYSTEM });
    const llm = new SessionAnthropic(sdk(standIn), session);
    const history: Message[] = [{ role: "user", content: TASK }];
    const stream = llm.messages.stream({ model: "claude-x", max_tokens: 256,
                                         messages: history });
    let text = "";
    for await (const piece of stream.textStream) text += piece;
    assert.equal(text, "Streamed: ACCT-8842 is reconciled.");
    const final = await stream.finalMessage();
    assert.equal(final.stop_reason, "end_turn");
    assert.equal(llm.stats.recallRounds, 1);
    assert.equal((await session.info()).ledger_len, 4);

    // A reply calling the agent's own tool goes to the caller as it streams (create, stream).
    history.push({ role: "assistant", content: final.content }, { role: "user", content: "Go on." });
    const raw = await llm.messages.create({ model: "claude-x", max_tokens: 256,
                                            messages: history, tools: TOOLS, stream: true });
    const types: string[] = [];
    for await (const event of raw) types.push(event.type);
    assert.equal(types[0], "message_start");
    assert.ok(types.includes("content_block_start") && types.at(-1) === "message_stop");
    const called = await raw.finalMessage();
    assert.deepEqual(called.content.map((b) => b.type), ["text", "tool_use"]);
    assert.deepEqual(called.content[1]?.input, { page: 1 });
    assert.equal((await session.info()).ledger_len, 6);
  } finally {
    await standIn.stop();
  }
});

test("a prompt too long for the model folds inline and is sent again, once", async () => {
  // The model's window (2,500 tokens) is smaller than the budget: the guard lets the request
  // out, the model refuses it, the API folds and the retry goes out.
  const standIn = await StandIn.start(null, "--context-window", "2500");
  try {
    const session = await sf.session(sessionId("overflow"), {
      policy: { budget_tokens: 16000, keep_recent_turns: 1 }, system: SYSTEM });
    const history: Message[] = [{ role: "user", content: TASK }];
    for (const n of [1, 2, 3, 4]) {
      const id = `toolu_${n}`;
      history.push({ role: "assistant", content: [
        { type: "tool_use", id, name: "read_log", input: { page: n } }] });
      history.push({ role: "user", content: [
        { type: "tool_result", tool_use_id: id, content: page(n, 200) }] });
    }
    const llm = new SessionAnthropic(sdk(standIn), session);
    const reply = await llm.messages.create({ model: "claude-x", max_tokens: 256,
                                              messages: history });
    assert.equal(reply.role, "assistant");
    assert.equal(llm.stats.requests, 2);
    assert.equal(llm.stats.inlineFolds, 1);
    assert.ok((await session.info()).fold_revision > 0);
  } finally {
    await standIn.stop();
  }
});

test("a request no shrink can fit is refused naming what cannot fit", async () => {
  const standIn = await StandIn.start();
  try {
    const session = await sf.session(sessionId("cap"), {
      policy: { budget_tokens: 1000 }, system: "Rules. ".repeat(900) });
    const llm = new SessionAnthropic(sdk(standIn), session);
    await assert.rejects(
      llm.messages.create({ model: "claude-x", max_tokens: 64,
                           messages: [{ role: "user", content: TASK }] }),
      (error: unknown) => error instanceof ApiError && error.reason === "budget-exceeded" &&
        error.seq === null && /system prompt/.test(error.message));
  } finally {
    await standIn.stop();
  }
});

test("a history that does not begin with what was sent is refused", async () => {
  const standIn = await StandIn.start();
  try {
    const session = await sf.session(sessionId("mismatch"), {
      policy: { budget_tokens: 16000 }, system: SYSTEM });
    const llm = new SessionAnthropic(sdk(standIn), session);
    const history: Message[] = [{ role: "user", content: TASK }];
    await llm.messages.create({ model: "claude-x", max_tokens: 64, messages: history });
    // The reply was not added to the history before the next message.
    history.push({ role: "user", content: "And ACCT-8843?" });
    await assert.rejects(
      llm.messages.create({ model: "claude-x", max_tokens: 64, messages: history }),
      HistoryMismatchError);
    await assert.rejects(
      llm.messages.create({ model: "claude-x", max_tokens: 64, system: "Another prompt.",
                           messages: [history[0]!] }),
      HistoryMismatchError);
    assert.equal((await session.info()).ledger_len, 2);
  } finally {
    await standIn.stop();
  }
});

test("the recall tool's definition comes from the API, in both shapes", async () => {
  const tool = await sf.recallTool();
  assert.equal(tool.name, RECALL_TOOL_NAME);
  assert.equal(tool.anthropic.name, RECALL_TOOL_NAME);
  assert.deepEqual((tool.openai.function as { parameters: unknown }).parameters,
                   tool.anthropic.input_schema);
});
