// @sessionfold/client: sessionfold for TypeScript agents, over the HTTP API (`sessionfold
// serve`). No runtime dependency beyond fetch; the Anthropic and OpenAI SDKs are the caller's.
//
//   const sf = new Sessionfold({ baseUrl: "http://127.0.0.1:8080", apiKey: "sfk_..." });
//   const session = await sf.session("agent-7", { policy: { budget_tokens: 16000 }, system });
//   const llm = new SessionAnthropic(new Anthropic(), session);   // or SessionOpenAI
//   const reply = await llm.messages.create({ model, max_tokens, messages: history, tools });

export { ApiError, Session, Sessionfold } from "./api.js";
export type { OpenCallOptions, ReplyBody, SessionfoldOptions, SessionOptions } from "./api.js";
export { RECALL_TOOL_NAME } from "./calls.js";
export type { CallOptions, CallStats } from "./calls.js";
export { HistoryMismatchError } from "./history.js";
export { SessionAnthropic, SessionMessageStream } from "./anthropic.js";
export type {
  AnthropicLike,
  AnthropicMessage,
  ContentBlock,
  MessageParams,
  SessionAnthropicOptions,
  StreamEvent,
} from "./anthropic.js";
export { SessionChatStream, SessionOpenAI } from "./openai.js";
export type {
  ChatChunk,
  ChatCompletion,
  ChatMessage,
  ChatParams,
  ChatToolCall,
  OpenAILike,
} from "./openai.js";
export type * from "./types.js";
