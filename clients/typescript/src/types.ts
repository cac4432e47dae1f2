// The sessionfold HTTP API's bodies, as docs/openapi.json describes them (the parts a TypeScript
// agent reads). Messages, tools and replies stay the providers' own JSON: `unknown`-typed
// records here, typed by the SDK the agent uses.

/** A message in the Anthropic Messages shape or the OpenAI chat shape. */
export type Message = { role: string; content?: unknown; [field: string]: unknown };

/** Which provider's shape a request, a reply or a window is in. */
export type Shape = "anthropic" | "openai";

/** What a request past the budget less the guard's margin does, as the Python client's
 *  `over_budget`: `cap` (the default) folds the session inline and refuses what still cannot
 *  fit (`budget-exceeded`); `send` sends the best shrink, fitting or not. */
export type OverBudget = "cap" | "shrink" | "send" | "fold";

/** A fold policy (FoldPolicy): `budget_tokens` at least. */
export type Policy = { budget_tokens: number; [field: string]: unknown };

export interface SessionInfo {
  id: string;
  tenant: string | null;
  system: string;
  policy: Policy;
  revision: number;
  fold_revision: number;
  etag: string;
  paused: boolean;
  ledger_len: number;
  window_tokens: number;
  current_tokens: number;
  trigger_tokens: number;
  measured_tokens: number | null;
}

export interface AppendResult {
  first_seq: number;
  last_seq: number;
  revision: number;
  duplicate: boolean;
  crossed_trigger: boolean;
}

export interface WindowItem {
  start_seq: number;
  end_seq: number;
  kind: string;
  tokens: number | null;
}

export interface Window {
  session_id: string;
  system: string;
  revision: number;
  fold_revision: number;
  etag: string;
  shape: Shape;
  last_seq: number;
  tokens: number;
  items: WindowItem[];
  messages: Message[];
}

export type RecallOutcome = "served" | "clipped" | "unavailable" | "no-match" | "invalid";

export interface RecallAnswer {
  kind: "seq" | "query" | "unknown";
  outcome: RecallOutcome;
  tokens: number;
  next_seq?: string | null;
  next_offset?: number | null;
  text?: string;
}

/** The call loop's state: written by the API, sent back as it came. */
export type CallState = { version: 1; phase: "sending"; rounds: number; tools: string[];
                          [field: string]: unknown };

export interface GuardReport {
  /** under: the stored window as it is; shrunk: the guard left some of it out of this request;
   *  folded: folded inline first; over-budget: sent over because overBudget is "send". */
  outcome: "under" | "shrunk" | "folded" | "over-budget";
  /** The guard's estimate of the request in the provider's tokens (the caller's tools aside). */
  tokens: number;
  budget_tokens: number;
  limit_tokens: number;
  unsent_tokens: number;
  inline_folds: number;
  revision: number;
  last_seq: number;
}

/** The request as the guard sends it: what to send the model next. */
export interface GuardedRequest {
  shape: Shape;
  system: string;
  messages: Message[];
  /** The tools sessionfold adds (the recall tool, once offered), in the request's shape. */
  tools: Record<string, unknown>[];
  call: CallState;
  guard: GuardReport;
}

/** What follows a model's reply. */
export interface CallStep {
  next: "send" | "done" | "raise";
  request: GuardedRequest | null;
  recorded_seq: number | null;
  recall: RecallAnswer[];
  /** With done: the answers to the reply's recall calls, in its shape, for the next message. */
  tool_results: Record<string, unknown>[];
}

export interface RecallToolDefinition {
  name: string;
  version: number;
  anthropic: Record<string, unknown>;
  openai: Record<string, unknown>;
}
