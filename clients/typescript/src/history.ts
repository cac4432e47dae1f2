// What the SDK wrappers share of the caller's history: plain SDK code sends its whole history
// on every call; a wrapper appends only what is new of it to the session, and sends the
// session's (compacted) window instead.

import type { Message, Shape } from "./types.js";

/** The caller's history does not begin with what the wrapper sent before (a message changed
 *  role, the reply was not added, messages were taken out), or its system prompt is not the
 *  session's. Nothing was appended. */
export class HistoryMismatchError extends Error {
  override readonly name = "HistoryMismatchError";

  constructor(message: string, readonly index: number | null = null) {
    super(message);
  }
}

/** Answers to recall calls of the last reply, for the next message (the reply called the
 *  recall tool beside the agent's own tools). */
export interface PendingResults {
  /** Every tool call id of the reply, in the order it made them. */
  order: string[];
  /** The answers, in the reply's shape (tool_result blocks, or tool messages). */
  results: Record<string, unknown>[];
}

/** The caller's messages the session holds, by role: what the next call must begin with. */
export class History {
  private readonly roles: (string | null)[];

  /** `known`: how many of the caller's first messages the session holds already (a wrapper
   *  made again for a session an earlier process filled). */
  constructor(known = 0) {
    this.roles = new Array<string | null>(known).fill(null);
  }

  get length(): number {
    return this.roles.length;
  }

  /** The caller's messages past those the session holds. */
  newMessages(messages: readonly Message[]): Message[] {
    if (!Array.isArray(messages)) throw new HistoryMismatchError("messages is a list of messages");
    if (messages.length < this.roles.length) {
      throw new HistoryMismatchError(
        `the history has ${messages.length} messages but the session holds the first ` +
        `${this.roles.length} of them (the replies included): send the whole history, ` +
        "with each reply added as the SDK gave it", messages.length);
    }
    this.roles.forEach((role, i) => {
      const theirs = messages[i]?.role;
      if (role !== null && theirs !== role) {
        throw new HistoryMismatchError(
          `the history differs from what the session holds at message ${i} (a ${theirs} ` +
          `message here, a ${role} message sent before): messages must begin with the ` +
          `${this.roles.length} the session holds, in order`, i);
      }
    });
    return messages.slice(this.roles.length);
  }

  /** The caller's `messages` (or the reply, as the caller adds it) are the session's now. */
  held(...messages: readonly { role: string }[]): void {
    this.roles.push(...messages.map((m) => m.role));
  }
}

type Block = Record<string, unknown>;

/** `messages` with the recall answers of the reply before them added to the first one, in the
 *  reply's order of calls (the caller answered its own tools only). */
export function withRecallAnswers(messages: Message[], pending: PendingResults | null,
                                  shape: Shape): Message[] {
  if (pending === null || messages.length === 0) return messages;
  const answered = new Set(pending.results.map((r) => String(r.tool_use_id ?? r.tool_call_id)));
  const rank = (id: unknown): number => {
    const at = pending.order.indexOf(String(id));
    return at < 0 ? pending.order.length : at;
  };
  if (shape === "openai") {
    let lead = 0;
    while (lead < messages.length && messages[lead]?.role === "tool") lead++;
    const own = messages.slice(0, lead).filter((m) => !answered.has(String(m.tool_call_id)));
    const tools = [...own, ...(pending.results as Message[])]
      .sort((x, y) => rank(x.tool_call_id) - rank(y.tool_call_id));
    return [...tools, ...messages.slice(lead)];
  }
  const [first, ...rest] = messages;
  if (first === undefined || first.role !== "user") return messages;
  const content: Block[] = typeof first.content === "string"
    ? [{ type: "text", text: first.content }]
    : Array.isArray(first.content) ? (first.content as Block[]) : [];
  const isResult = (b: Block): boolean => b.type === "tool_result";
  const results = [...content.filter((b) => isResult(b) && !answered.has(String(b.tool_use_id))),
                   ...pending.results]
    .sort((x, y) => rank(x.tool_use_id) - rank(y.tool_use_id));
  return [{ ...first, content: [...results, ...content.filter((b) => !isResult(b))] }, ...rest];
}

/** A short, stable key for appending `messages` after `position` messages (a retried call
 *  appends them once): FNV-1a over their JSON, twice over, as hex. */
export function appendKey(position: number, messages: readonly Message[]): string {
  const text = JSON.stringify(messages);
  let a = 0x811c9dc5;
  let b = 0x01000193 ^ text.length;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    a = Math.imul(a ^ c, 0x01000193) >>> 0;
    b = Math.imul(b ^ c, 0x01000193 ^ 0x5bd1e995) >>> 0;
  }
  return `sf-ts-${position}-${a.toString(16).padStart(8, "0")}${b.toString(16).padStart(8, "0")}`;
}
