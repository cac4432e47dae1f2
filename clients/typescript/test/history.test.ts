// The history the wrappers keep, and the recall answers they add to the next message: no server.

import assert from "node:assert/strict";
import { test } from "node:test";

import { appendKey, History, HistoryMismatchError, withRecallAnswers } from "../src/history.js";
import type { Message } from "../src/types.js";

test("only the messages past those the session holds are new", () => {
  const history = new History();
  const first: Message[] = [{ role: "user", content: "task" }];
  assert.deepEqual(history.newMessages(first), first);
  history.held(...first, { role: "assistant" });
  const next: Message[] = [...first, { role: "assistant", content: "ok" },
                           { role: "user", content: "more" }];
  assert.deepEqual(history.newMessages(next), [{ role: "user", content: "more" }]);
  // The reply left out of the history, or a message changed role: refused.
  assert.throws(() => history.newMessages([...first, { role: "user", content: "more" }]),
                (e: unknown) => e instanceof HistoryMismatchError && e.index === 1);
  assert.throws(() => history.newMessages(first), HistoryMismatchError);
});

test("a wrapper made for a filled session takes what it holds as known", () => {
  const history = new History(2);
  const messages: Message[] = [{ role: "user", content: "a" }, { role: "assistant", content: "b" },
                               { role: "user", content: "c" }];
  assert.deepEqual(history.newMessages(messages), [{ role: "user", content: "c" }]);
});

test("recall answers join the caller's results in the order the reply called", () => {
  const pending = { order: ["own_1", "recall_1", "own_2"],
                    results: [{ type: "tool_result", tool_use_id: "recall_1", content: "found" }] };
  const [answer] = withRecallAnswers([{ role: "user", content: [
    { type: "tool_result", tool_use_id: "own_2", content: "two" },
    { type: "tool_result", tool_use_id: "recall_1", content: "the caller's own guess" },
    { type: "tool_result", tool_use_id: "own_1", content: "one" },
    { type: "text", text: "go on" }] }], pending, "anthropic");
  assert.deepEqual((answer!.content as { tool_use_id?: string; content?: string }[])
    .map((b) => b.tool_use_id ?? "text"), ["own_1", "recall_1", "own_2", "text"]);
  assert.equal((answer!.content as { content?: string }[])[1]!.content, "found");
});

test("in the OpenAI shape the answers are tool messages among the caller's", () => {
  const pending = { order: ["c1", "r1"],
                    results: [{ role: "tool", tool_call_id: "r1", content: "found" }] };
  const sent = withRecallAnswers([{ role: "tool", tool_call_id: "c1", content: "one" },
                                  { role: "user", content: "and then?" }], pending, "openai");
  assert.deepEqual(sent.map((m) => m.tool_call_id ?? m.role), ["c1", "r1", "user"]);
});

test("an append key names the position and the messages, nothing else", () => {
  const messages: Message[] = [{ role: "user", content: "x" }];
  assert.equal(appendKey(3, messages), appendKey(3, [{ role: "user", content: "x" }]));
  assert.notEqual(appendKey(3, messages), appendKey(4, messages));
  assert.notEqual(appendKey(3, messages), appendKey(3, [{ role: "user", content: "y" }]));
  assert.match(appendKey(3, messages), /^sf-ts-3-[0-9a-f]{16}$/);
});
