// A drop-in wrapper of the official OpenAI SDK's chat completions (openai, not imported: the
// wrapper calls the client it is given), as SessionAnthropic does for the Messages API:
//
//   const llm = new SessionOpenAI(new OpenAI(), session);
//   const completion = await llm.chat.completions.create({ model, messages: history, tools });
//
// The history's leading system (or developer) messages must say the session's system prompt, or
// be left out: the request sent has the session's first. `stream: true` gives a SessionChatStream
// of the final reply's chunks (the usage chunk only when asked for with stream_options).

import type { Session } from "./api.js";
import { type Attempt, type CallOptions, Calls, type CallStats, type Opened } from "./calls.js";
import type { GuardedRequest, Message } from "./types.js";

/** A tool call of an assistant message. */
export interface ChatToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
}

/** An assistant message of a chat completion. */
export interface ChatMessage {
  role: "assistant";
  content: string | null;
  refusal?: string | null;
  tool_calls?: ChatToolCall[];
  [field: string]: unknown;
}

/** A chat completion, as the SDK returns it. */
export interface ChatCompletion {
  id: string;
  model: string;
  choices: { index: number; message: ChatMessage; finish_reason: string | null;
             [field: string]: unknown }[];
  usage?: Record<string, unknown> | null;
  [field: string]: unknown;
}

/** A chunk of a streamed completion. */
export type ChatChunk = {
  id: string;
  model: string;
  choices: { index: number; finish_reason?: string | null;
             delta: { content?: string | null; refusal?: string | null;
                      tool_calls?: { index: number; id?: string;
                                     function?: { name?: string; arguments?: string } }[] } }[];
  usage?: Record<string, unknown> | null;
  [field: string]: unknown;
};

/** The SDK's arguments (`messages` is the caller's whole history). */
export type ChatParams = {
  messages: Message[];
  tools?: unknown[];
  stream?: boolean;
  stream_options?: { include_usage?: boolean; [option: string]: unknown } | null;
  [param: string]: unknown;
};

/** What the wrapper needs of an OpenAI client: `chat.completions.create`. */
export interface OpenAILike {
  chat: { completions: { create(params: never): PromiseLike<unknown> } };
}

const SYSTEM_ROLES = new Set(["system", "developer"]);

/** An OpenAI client bound to one session (see the module comment). */
export class SessionOpenAI {
  readonly chat: {
    completions: {
      create(params: ChatParams & { stream: true }): Promise<SessionChatStream>;
      create(params: ChatParams): Promise<ChatCompletion>;
    };
  };
  private readonly calls: Calls;

  constructor(readonly client: OpenAILike, readonly session: Session,
              options: CallOptions = {}) {
    this.calls = new Calls(session, "openai", options);
    const create = async (params: ChatParams): Promise<ChatCompletion | SessionChatStream> =>
      params.stream === true ? this.openStream(params) : this.create(params);
    this.chat = { completions: { create: create as SessionOpenAI["chat"]["completions"]["create"] } };
  }

  /** What this wrapper's calls came to (requests, the guard, recall). */
  get stats(): CallStats {
    return this.calls.stats;
  }

  private async create(params: ChatParams): Promise<ChatCompletion> {
    await this.prepare(params);
    const create = this.sdkCreate();
    return this.calls.call((request) =>
      create(requestParams(params, request)) as Promise<ChatCompletion>);
  }

  private async openStream(params: ChatParams): Promise<SessionChatStream> {
    await this.prepare(params);
    const create = this.sdkCreate();
    const showUsage = params.stream_options?.include_usage === true;
    const opened = await this.calls.openStream(async (request) => {
      const streamed = { ...requestParams(params, request), stream: true,
                         stream_options: { ...params.stream_options, include_usage: true } };
      return new ChatAttempt(await create(streamed) as AsyncIterable<ChatChunk>, showUsage);
    });
    return new SessionChatStream(opened, this.calls);
  }

  /** Append what is new of the history; its leading system messages must say the session's
   *  prompt (the request sent has the session's first). */
  private async prepare(params: ChatParams): Promise<void> {
    const messages = Array.isArray(params.messages) ? params.messages : [];
    let lead = 0;
    while (lead < messages.length && SYSTEM_ROLES.has(String(messages[lead]?.role))) lead++;
    const system = messages.slice(0, lead).map((m) => contentText(m.content)).join("\n");
    await this.calls.prepare(messages.slice(lead), lead ? system : null);
  }

  private sdkCreate(): (params: Record<string, unknown>) => PromiseLike<unknown> {
    const completions = this.client.chat.completions as
      { create(params: Record<string, unknown>): PromiseLike<unknown> };
    return (params) => completions.create(params);
  }
}

function contentText(content: unknown): string {
  if (typeof content === "string") return content;
  return Array.isArray(content)
    ? content.map((part) => String((part as { text?: unknown }).text ?? "")).join("") : "";
}

function requestParams(params: ChatParams, request: GuardedRequest): Record<string, unknown> {
  const { messages: _history, stream: _stream, stream_options: _options, ...rest } = params;
  const tools = [...(params.tools ?? []), ...request.tools];
  return { ...rest, messages: request.messages, ...(tools.length ? { tools } : {}) };
}

/** One streamed completion as the rounds read it, adding its chunks up to the reply. */
class ChatAttempt implements Attempt<ChatChunk> {
  private readonly chunks: AsyncIterator<ChatChunk>;
  private id = "";
  private model = "";
  private usage: Record<string, unknown> | null = null;
  private text: string[] = [];
  private refusal: string[] = [];
  private readonly toolCalls = new Map<number, ChatToolCall>();
  private finishReason: string | null = null;

  constructor(stream: AsyncIterable<ChatChunk>, private readonly showUsage: boolean) {
    this.chunks = stream[Symbol.asyncIterator]();
  }

  async next(): Promise<IteratorResult<ChatChunk>> {
    for (;;) {
      const result = await this.chunks.next();
      if (result.done) return result;
      this.add(result.value);
      // The usage chunk was asked for by the wrapper, to report it: the caller sees it only
      // when it asked for it too.
      if (result.value.choices.length > 0 || this.showUsage) return result;
    }
  }

  private add(chunk: ChatChunk): void {
    this.id ||= chunk.id;
    this.model ||= chunk.model;
    if (chunk.usage) this.usage = chunk.usage;
    const choice = chunk.choices[0];
    if (choice === undefined) return;
    const delta = choice.delta;
    if (delta.content) this.text.push(delta.content);
    if (delta.refusal) this.refusal.push(delta.refusal);
    for (const call of delta.tool_calls ?? []) {
      const entry = this.toolCalls.get(call.index) ??
        { id: "", type: "function" as const, function: { name: "", arguments: "" } };
      entry.id = call.id ?? entry.id;
      entry.function.name += call.function?.name ?? "";
      entry.function.arguments += call.function?.arguments ?? "";
      this.toolCalls.set(call.index, entry);
    }
    this.finishReason = choice.finish_reason ?? this.finishReason;
  }

  toolCall(chunk: ChatChunk): string | null {
    for (const call of chunk.choices[0]?.delta.tool_calls ?? []) {
      if (call.function?.name) return call.function.name;
    }
    return null;
  }

  /** The assistant message the chunks add up to. */
  message(): ChatMessage {
    const message: ChatMessage = { role: "assistant", content: this.text.join("") || null,
                                   refusal: this.refusal.join("") || null };
    if (this.toolCalls.size) {
      message.tool_calls = [...this.toolCalls.entries()].sort(([a], [b]) => a - b)
        .map(([, call]) => call);
    }
    return message;
  }

  reply(): ChatCompletion {
    return { id: this.id, object: "chat.completion", model: this.model,
             choices: [{ index: 0, message: this.message(), finish_reason: this.finishReason }],
             usage: this.usage };
  }

  async close(): Promise<void> {
    await this.chunks.return?.();
  }
}

/** The final reply of a streamed completion: its chunks (`for await`), then `message()` (the
 *  assistant message to add to the history) and `finalChatCompletion()`. Recall rounds happened
 *  out of its sight; the reply is recorded when it has been read to its end. */
export class SessionChatStream implements AsyncIterable<ChatChunk> {
  private chunks: AsyncGenerator<ChatChunk> | null = null;
  private ended = false;

  /** @internal */
  constructor(private readonly opened: Opened<ChatChunk>, private readonly calls: Calls) {}

  private async *relay(): AsyncGenerator<ChatChunk> {
    const opened = this.opened;
    yield* opened.read;
    if (opened.done === null) {
      for (let chunk = await opened.attempt.next(); !chunk.done;
        chunk = await opened.attempt.next()) {
        yield chunk.value;
      }
    }
    await this.calls.finish(opened);
    this.ended = true;
  }

  [Symbol.asyncIterator](): AsyncIterator<ChatChunk> {
    this.chunks ??= this.relay();
    return this.chunks;
  }

  /** The completion the chunks add up to, once read to the end (read here if it was not). */
  async finalChatCompletion(): Promise<ChatCompletion> {
    for await (const _ of this) { /* read to the end */ }
    if (!this.ended) throw new Error("the stream was closed before its end");
    return (this.opened.attempt as ChatAttempt).reply();
  }

  /** The streamed assistant message: what the caller adds to its history. */
  async message(): Promise<ChatMessage> {
    const completion = await this.finalChatCompletion();
    return completion.choices[0]!.message;
  }

  /** Stop reading: the reply is not recorded. */
  async abort(): Promise<void> {
    await this.chunks?.return(undefined);
    await this.opened.attempt.close();
  }
}
