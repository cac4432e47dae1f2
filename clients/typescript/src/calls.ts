// The client's side of the guarded request: one model call is a short exchange with the API,
// whose call loop (the same one SessionHandle.call runs in Python) decides each step.
//
//   request = POST .../call                 the request as the guard sends it
//   reply = model(request)                  the only I/O of the agent's own
//   step = POST .../call/reply (reply)      "send" again (a recall round, the retry after an
//                                           overflow), "done" (recorded), or "raise"
//
// The call's state travels in `request.call` and back; nothing is kept here between steps but
// the answers to a reply's recall calls, which go with the agent's next message.

import type { Session } from "./api.js";
import {
  appendKey,
  History,
  HistoryMismatchError,
  type PendingResults,
  withRecallAnswers,
} from "./history.js";
import type {
  CallStep,
  GuardedRequest,
  Message,
  OverBudget,
  RecallOutcome,
  Shape,
} from "./types.js";

export const RECALL_TOOL_NAME = "sessionfold_recall";

/** What one wrapper's calls came to. */
export interface CallStats {
  /** Model requests sent (recall rounds and retries after an overflow included). */
  requests: number;
  /** Requests the guard shrank, sent over the budget (overBudget "send"), or folded for. */
  shrunk: number;
  overBudget: number;
  inlineFolds: number;
  /** The largest request the guard estimated (the provider's tokens, your tools aside). */
  largestRequestTokens: number;
  /** Recall rounds the API answered, and every recall answer by outcome. */
  recallRounds: number;
  recall: Partial<Record<RecallOutcome, number>>;
}

export interface CallOptions {
  overBudget?: OverBudget;
  cacheBreakpoints?: boolean;
  /** How many of the caller's first messages the session holds already (default 0). */
  known?: number;
}

/** An error of the model call as the API reads it: its HTTP status and body (the SDKs' APIError
 *  has both); undefined for an error that never reached the provider. */
function providerError(error: unknown): { status: number; body: unknown } | undefined {
  if (typeof error !== "object" || error === null) return undefined;
  const { status, error: body, message } = error as
    { status?: unknown; error?: unknown; message?: unknown };
  if (typeof status !== "number" || status < 100 || status > 599) return undefined;
  return { status, body: body ?? (typeof message === "string" ? message : null) };
}

/** One event stream of a request, as the rounds read it. */
export interface Attempt<E> {
  next(): Promise<IteratorResult<E>>;
  /** The name of the tool whose call `event` starts, if it starts one. */
  toolCall(event: E): string | null;
  /** The reply the events read so far add up to (the provider's JSON shape). */
  reply(): unknown;
  close(): Promise<void>;
}

/** The stream the caller reads: its attempt, the events already read from it, and the step
 *  that ended the call if it was read to its end while being looked at. */
export interface Opened<E> {
  attempt: Attempt<E>;
  request: GuardedRequest;
  read: E[];
  done: CallStep | null;
}

/** The calls of one wrapper on one session, in one shape. */
export class Calls {
  readonly stats: CallStats = { requests: 0, shrunk: 0, overBudget: 0, inlineFolds: 0,
                                largestRequestTokens: 0, recallRounds: 0, recall: {} };
  private readonly history: History;
  private pending: PendingResults | null = null;
  private system: string | undefined;

  constructor(readonly session: Session, readonly shape: Shape,
              private readonly options: CallOptions = {}) {
    this.history = new History(options.known ?? 0);
  }

  /** Append what is new of the caller's `messages` (the recall answers the last reply asked
   *  for added to the first), before the call; `system`, when the caller gave one, must be
   *  the session's prompt (HistoryMismatchError, nothing appended). */
  async prepare(messages: readonly Message[], system: string | null = null): Promise<void> {
    if (system !== null) {
      this.system ??= (await this.session.info()).system;  // fixed when the session was made
      if (system !== this.system) {
        throw new HistoryMismatchError(
          `the system prompt given (${system.length} characters) is not the session's (fixed ` +
          "when it was made): leave it out to send the session's");
      }
    }
    const fresh = this.history.newMessages(messages);
    if (fresh.length === 0) return;
    const sent = withRecallAnswers(fresh, this.pending, this.shape);
    await this.session.append(sent, { shape: this.shape,
                                      key: appendKey(this.history.length, fresh) });
    this.history.held(...fresh);
    this.pending = null;
  }

  /** One call, not streamed: `send` is the model call; the reply that ends the call. */
  async call<R>(send: (request: GuardedRequest) => Promise<R>): Promise<R> {
    let request = await this.open();
    for (;;) {
      let reply: R;
      try {
        reply = await send(request);
      } catch (error) {
        request = await this.failed(request, error);
        continue;
      }
      const step = await this.replied(request, reply, false);
      if (step.next === "done") return reply;
      request = this.nextRequest(step);
    }
  }

  /** Open streams as the API says until one is not a recall-only reply (or the rounds are
   *  used up): the one the caller reads. */
  async openStream<E>(start: (request: GuardedRequest) => Promise<Attempt<E>>):
      Promise<Opened<E>> {
    let request = await this.open();
    for (;;) {
      let attempt: Attempt<E>;
      try {
        attempt = await start(request);
      } catch (error) {
        request = await this.failed(request, error);
        continue;
      }
      if (!request.call.tools.includes(RECALL_TOOL_NAME)) {
        return { attempt, request, read: [], done: null };  // nothing to answer: relay at once
      }
      const read: E[] = [];
      let step: CallStep;
      try {
        for (let event = await attempt.next(); !event.done; event = await attempt.next()) {
          read.push(event.value);
          const tool = attempt.toolCall(event.value);
          if (tool !== null && tool !== RECALL_TOOL_NAME) {
            return { attempt, request, read, done: null };  // the agent's own tool: its reply
          }
        }
        step = await this.replied(request, attempt.reply(), false);
      } catch (error) {
        await attempt.close();
        throw error;
      }
      if (step.next === "done") return { attempt, request, read, done: step };
      await attempt.close();
      request = this.nextRequest(step);
    }
  }

  /** The end of a stream the caller read: its reply recorded (unless it was already). */
  async finish<E>(opened: Opened<E>): Promise<void> {
    if (opened.done === null) opened.done = await this.replied(opened.request,
                                                               opened.attempt.reply(), true);
  }

  private async open(): Promise<GuardedRequest> {
    const request = await this.session.openCall({
      shape: this.shape, overBudget: this.options.overBudget,
      cacheBreakpoints: this.shape === "anthropic" ? this.options.cacheBreakpoints : undefined });
    return this.sending(request);
  }

  private sending(request: GuardedRequest): GuardedRequest {
    const stats = this.stats;
    stats.requests += 1;
    stats.largestRequestTokens = Math.max(stats.largestRequestTokens, request.guard.tokens);
    stats.inlineFolds += request.guard.inline_folds;
    if (request.guard.outcome === "shrunk") stats.shrunk += 1;
    if (request.guard.outcome === "over-budget") stats.overBudget += 1;
    return request;
  }

  private async failed(request: GuardedRequest, error: unknown): Promise<GuardedRequest> {
    const reported = providerError(error);
    if (reported === undefined) throw error;
    const step = await this.session.reply({ call: request.call, shape: this.shape,
                                            error: reported });
    if (step.next === "raise") throw error;
    return this.nextRequest(step);
  }

  private async replied(request: GuardedRequest, reply: unknown, relayed: boolean):
      Promise<CallStep> {
    const step = await this.session.reply({ call: request.call, shape: this.shape,
                                            reply: toJson(reply), relayed });
    for (const answer of step.recall) {
      this.stats.recall[answer.outcome] = (this.stats.recall[answer.outcome] ?? 0) + 1;
    }
    if (step.next === "send") {
      this.stats.recallRounds += step.recall.length > 0 ? 1 : 0;
    } else if (step.next === "done") {
      // The caller adds the reply to its history: the session holds it (recorded, or, with no
      // content, nothing to hold), and its next message answers the reply's tool calls.
      this.history.held({ role: "assistant" });
      this.pending = step.tool_results.length > 0
        ? { order: toolCallIds(toJson(reply), this.shape), results: step.tool_results } : null;
    }
    return step;
  }

  private nextRequest(step: CallStep): GuardedRequest {
    if (step.request === null) throw new Error(`the API said ${step.next} without a request`);
    return this.sending(step.request);
  }
}

/** An SDK's reply as JSON (the SDKs return plain objects; a class instance is serialised). */
function toJson(reply: unknown): unknown {
  return reply !== null && typeof reply === "object" && !Array.isArray(reply) &&
    Object.getPrototypeOf(reply) === Object.prototype ? reply : JSON.parse(JSON.stringify(reply));
}

function toolCallIds(reply: unknown, shape: Shape): string[] {
  const r = reply as { content?: { type?: string; id?: string }[];
                       choices?: { message?: { tool_calls?: { id?: string }[] } }[] };
  if (shape === "openai") {
    return (r.choices?.[0]?.message?.tool_calls ?? []).map((c) => String(c.id));
  }
  return (Array.isArray(r.content) ? r.content : [])
    .filter((b) => b.type === "tool_use").map((b) => String(b.id));
}
