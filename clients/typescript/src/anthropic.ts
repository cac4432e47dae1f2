// A drop-in wrapper of the official Anthropic SDK (@anthropic-ai/sdk, not imported: the wrapper
// calls the client it is given): the agent's loop stays plain SDK code.
//
//   const llm = new SessionAnthropic(new Anthropic(), session);
//   const reply = await llm.messages.create({ model, max_tokens, messages: history, tools });
//
// Each call appends what is new of the history to the session, sends the session's window as
// the guard lets it out (the recall tool beside the caller's tools once it is offered, cache
// breakpoints), and lets the API's call loop do the rest: usage reported, recall rounds
// answered out of the caller's sight, an inline fold and one retry on "prompt is too long", the
// reply recorded. Streaming (`messages.stream`, `create({stream: true})`) goes the same way.

import type { Session } from "./api.js";
import { type Attempt, type CallOptions, Calls, type CallStats, type Opened } from "./calls.js";
import type { GuardedRequest, Message } from "./types.js";

interface StreamSource {
  opened: Opened<StreamEvent>;
  calls: Calls;
}

/** A content block of a reply (text, tool_use, thinking...). */
export interface ContentBlock {
  type: string;
  text?: string;
  id?: string;
  name?: string;
  input?: unknown;
  [field: string]: unknown;
}

/** A Messages API reply, as the SDK returns it. */
export interface AnthropicMessage {
  id: string;
  type: "message";
  role: "assistant";
  model: string;
  content: ContentBlock[];
  stop_reason: string | null;
  stop_sequence?: string | null;
  usage: Record<string, unknown>;
  [field: string]: unknown;
}

/** A raw event of a streamed reply (message_start, content_block_delta...). */
export type StreamEvent = { type: string; [field: string]: unknown };

/** The SDK's keyword arguments (`messages` is the caller's whole history). */
export type MessageParams = {
  messages: Message[];
  system?: string | { type: string; text?: string }[];
  tools?: unknown[];
  stream?: boolean;
  [param: string]: unknown;
};

/** What the wrapper needs of an Anthropic client: `messages.create`. */
export interface AnthropicLike {
  messages: { create(params: never): PromiseLike<unknown> };
}

export interface SessionAnthropicOptions extends CallOptions {
  /** Prompt-cache breakpoints after the window's stable head and its last message (default
   *  true). */
  cacheBreakpoints?: boolean;
}

/** An Anthropic client bound to one session (see the module comment). */
export class SessionAnthropic {
  readonly messages: {
    create(params: MessageParams & { stream: true }): Promise<SessionMessageStream>;
    create(params: MessageParams): Promise<AnthropicMessage>;
    stream(params: MessageParams): SessionMessageStream;
  };
  private readonly calls: Calls;

  constructor(readonly client: AnthropicLike, readonly session: Session,
              options: SessionAnthropicOptions = {}) {
    this.calls = new Calls(session, "anthropic",
                           { cacheBreakpoints: true, ...options });
    const create = async (params: MessageParams):
        Promise<AnthropicMessage | SessionMessageStream> => {
      if (params.stream !== true) return this.create(params);
      const stream = new SessionMessageStream(this.openStream(params));
      await stream.opened();  // as the SDK's create: an error of the request rejects here
      return stream;
    };
    this.messages = {
      create: create as SessionAnthropic["messages"]["create"],
      stream: (params) => new SessionMessageStream(this.openStream(params)),
    };
  }

  /** What this wrapper's calls came to (requests, the guard, recall). */
  get stats(): CallStats {
    return this.calls.stats;
  }

  private async create(params: MessageParams): Promise<AnthropicMessage> {
    await this.calls.prepare(params.messages, systemText(params.system));
    const create = this.sdkCreate();
    return this.calls.call((request) =>
      create(requestParams(params, request, false)) as Promise<AnthropicMessage>);
  }

  private async openStream(params: MessageParams): Promise<StreamSource> {
    await this.calls.prepare(params.messages, systemText(params.system));
    const create = this.sdkCreate();
    const opened = await this.calls.openStream(async (request) =>
      new MessageAttempt(await create(requestParams(params, request, true)) as
                         AsyncIterable<StreamEvent>));
    return { opened, calls: this.calls };
  }

  private sdkCreate(): (params: Record<string, unknown>) => PromiseLike<unknown> {
    const messages = this.client.messages as
      { create(params: Record<string, unknown>): PromiseLike<unknown> };
    return (params) => messages.create(params);
  }
}

function systemText(system: MessageParams["system"]): string | null {
  if (system === undefined || system === null) return null;
  if (typeof system === "string") return system;
  return system.map((block) => block.text ?? "").join("");
}

/** The SDK's arguments for one request: the caller's, with the window's messages, the
 *  session's system prompt unless given (the same, checked before), and sessionfold's tools
 *  beside the caller's. */
function requestParams(params: MessageParams, request: GuardedRequest, stream: boolean):
    Record<string, unknown> {
  const { messages: _history, stream: _stream, ...rest } = params;
  const tools = [...(params.tools ?? []), ...request.tools];
  return {
    ...rest,
    ...(params.system === undefined && request.system ? { system: request.system } : {}),
    ...(tools.length ? { tools } : {}),
    messages: request.messages,
    ...(stream ? { stream: true } : {}),
  };
}

/** One streamed reply as the rounds read it, adding its events up to the message. */
class MessageAttempt implements Attempt<StreamEvent> {
  private readonly events: AsyncIterator<StreamEvent>;
  private readonly message = new MessageSnapshot();

  constructor(private readonly stream: AsyncIterable<StreamEvent>) {
    this.events = stream[Symbol.asyncIterator]();
  }

  async next(): Promise<IteratorResult<StreamEvent>> {
    const result = await this.events.next();
    if (!result.done) this.message.add(result.value);
    return result;
  }

  toolCall(event: StreamEvent): string | null {
    const block = event.content_block as ContentBlock | undefined;
    return event.type === "content_block_start" && block?.type === "tool_use"
      ? String(block.name ?? "") : null;
  }

  reply(): AnthropicMessage {
    return this.message.final();
  }

  async close(): Promise<void> {
    await this.events.return?.();
  }
}

/** A reply being streamed, as the raw events add it up (the SDK's accumulation, in short). */
class MessageSnapshot {
  private message: AnthropicMessage | null = null;
  private readonly partialJson = new Map<number, string>();

  add(event: StreamEvent): void {
    const index = typeof event.index === "number" ? event.index : -1;
    switch (event.type) {
      case "message_start":
        this.message = { ...(event.message as AnthropicMessage), content: [] };
        break;
      case "content_block_start":
        this.content()[index] = { ...(event.content_block as ContentBlock) };
        break;
      case "content_block_delta":
        this.delta(index, event.delta as Record<string, unknown>);
        break;
      case "content_block_stop": {
        const json = this.partialJson.get(index);
        const block = this.content()[index];
        if (json !== undefined && block !== undefined) block.input = json ? JSON.parse(json) : {};
        this.partialJson.delete(index);
        break;
      }
      case "message_delta": {
        const message = this.current();
        Object.assign(message, event.delta as object);
        for (const [name, value] of Object.entries((event.usage ?? {}) as object)) {
          if (value !== null && value !== undefined) message.usage[name] = value;
        }
        break;
      }
    }
  }

  final(): AnthropicMessage {
    return this.current();
  }

  private current(): AnthropicMessage {
    if (this.message === null) throw new Error("the stream has not started a message");
    return this.message;
  }

  private content(): ContentBlock[] {
    return this.current().content;
  }

  private delta(index: number, delta: Record<string, unknown>): void {
    const block = this.content()[index];
    if (block === undefined) return;
    switch (delta.type) {
      case "text_delta":
        block.text = (block.text ?? "") + String(delta.text);
        break;
      case "input_json_delta":
        this.partialJson.set(index, (this.partialJson.get(index) ?? "") +
                                    String(delta.partial_json));
        break;
      case "thinking_delta":
        block.thinking = String(block.thinking ?? "") + String(delta.thinking);
        break;
      case "signature_delta":
        block.signature = delta.signature;
        break;
      case "citations_delta":
        block.citations = [...((block.citations as unknown[]) ?? []), delta.citation];
        break;
    }
  }
}

/** The final reply of a streamed call: its raw events (`for await`), `textStream`,
 *  `finalMessage()`, `finalText()`. Recall rounds happened out of its sight; the reply is
 *  recorded when it has been read to its end. */
export class SessionMessageStream implements AsyncIterable<StreamEvent> {
  private events: AsyncGenerator<StreamEvent> | null = null;
  private final: AnthropicMessage | null = null;

  /** @internal */
  constructor(private readonly opening: Promise<StreamSource>) {
    opening.catch(() => undefined);  // a stream never read must not be an unhandled rejection
  }

  /** @internal The request is out and its reply's stream open (rejects as the request). */
  async opened(): Promise<void> {
    await this.opening;
  }

  private async *relay(): AsyncGenerator<StreamEvent> {
    const { opened, calls } = await this.opening;
    yield* opened.read;
    if (opened.done === null) {
      for (let event = await opened.attempt.next(); !event.done;
        event = await opened.attempt.next()) {
        yield event.value;
      }
    }
    await calls.finish(opened);
    this.final = opened.attempt.reply() as AnthropicMessage;
  }

  [Symbol.asyncIterator](): AsyncIterator<StreamEvent> {
    this.events ??= this.relay();
    return this.events;
  }

  /** The text of the reply as it is streamed. */
  get textStream(): AsyncIterable<string> {
    const events = this;
    return {
      async *[Symbol.asyncIterator]() {
        for await (const event of events) {
          const delta = event.delta as { type?: string; text?: string } | undefined;
          if (event.type === "content_block_delta" && delta?.type === "text_delta") {
            yield delta.text ?? "";
          }
        }
      },
    };
  }

  /** The whole reply, once the stream has been read to its end (read here if it was not). */
  async finalMessage(): Promise<AnthropicMessage> {
    for await (const _ of this) { /* read to the end */ }
    if (this.final === null) throw new Error("the stream was closed before its end");
    return this.final;
  }

  async finalText(): Promise<string> {
    const message = await this.finalMessage();
    return message.content.filter((b) => b.type === "text").map((b) => b.text ?? "").join("");
  }

  /** Stop reading: the reply is not recorded. */
  async abort(): Promise<void> {
    const { opened } = await this.opening;
    await this.events?.return(undefined);
    await opened.attempt.close();
  }
}
