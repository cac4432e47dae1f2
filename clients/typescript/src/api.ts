// The sessionfold HTTP API over plain fetch: `Sessionfold` (one deployment, one API key) and
// `Session` (one session in the key's tenant). Every error the API answers comes back as
// {"error": {"type", "reason", "message"}} and is thrown as an `ApiError`.

import type {
  AppendResult,
  CallState,
  CallStep,
  GuardedRequest,
  Message,
  OverBudget,
  Policy,
  RecallAnswer,
  RecallToolDefinition,
  SessionInfo,
  Shape,
  Window,
} from "./types.js";

/** An error the API answered with: `reason` names the library's error (`budget-exceeded`,
 *  `context-overflow`, `tool-pairing`, `session-not-found`...). */
export class ApiError extends Error {
  override readonly name = "ApiError";

  constructor(readonly status: number, readonly type: string, readonly reason: string,
              message: string, readonly detail: Record<string, unknown> = {}) {
    super(`${status} ${reason}: ${message}`);
  }

  /** With `budget-exceeded`: the ledger seq of the message that cannot fit (null: the system
   *  prompt). */
  get seq(): number | null {
    return typeof this.detail.seq === "number" ? this.detail.seq : null;
  }
}

export interface SessionfoldOptions {
  /** The API's base URL, e.g. http://127.0.0.1:8080 (without /v1). */
  baseUrl: string;
  /** A key made by `sessionfold keys create TENANT` (sfk_...). */
  apiKey: string;
  /** The fetch to use (the global one by default). */
  fetch?: typeof fetch;
}

export interface SessionOptions {
  policy?: Policy;
  system?: string;
}

export interface OpenCallOptions {
  shape?: Shape;
  /** The model call takes the tools sessionfold adds (the recall tool). Default true. */
  tools?: boolean;
  overBudget?: OverBudget;
  /** Prompt-cache breakpoints (Anthropic shape only); default: yes in the Anthropic shape. */
  cacheBreakpoints?: boolean;
}

export type ReplyBody =
  | { call: CallState; shape: Shape; reply: unknown; relayed?: boolean }
  | { call: CallState; shape: Shape; error: { status: number; body: unknown } };

type Query = Record<string, string | number | boolean | undefined>;

/** One sessionfold deployment, seen with one API key. */
export class Sessionfold {
  private readonly baseUrl: string;
  private readonly apiKey: string;
  private readonly fetchFn: typeof fetch;

  constructor(options: SessionfoldOptions) {
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.apiKey = options.apiKey;
    this.fetchFn = options.fetch ?? globalThis.fetch;
  }

  /** The session `id`, made with `policy` and `system` if it does not exist yet (an existing
   *  one must have the same policy and system prompt). Without a policy it must exist. */
  async session(id: string, options: SessionOptions = {}): Promise<Session> {
    if (options.policy !== undefined) {
      await this.request("POST", "/v1/sessions", {
        body: { id, policy: options.policy, system: options.system ?? "", exist_ok: true } });
    } else {
      await this.request("GET", `/v1/sessions/${encodeURIComponent(id)}`);
    }
    return new Session(this, id);
  }

  /** The recall tool's definition in both shapes (sessionfold adds it to guarded requests
   *  itself: an agent needs it only to send the tool on requests of its own). */
  async recallTool(): Promise<RecallToolDefinition> {
    return this.json("GET", "/v1/recall-tool");
  }

  /** @internal One request; an ApiError for any answer of 400 or more. */
  async request(method: string, path: string,
                { body, query, headers }: { body?: unknown; query?: Query;
                                            headers?: Record<string, string> } = {}):
      Promise<Response> {
    const search = new URLSearchParams();
    for (const [name, value] of Object.entries(query ?? {})) {
      if (value !== undefined) search.set(name, String(value));
    }
    const url = this.baseUrl + path + (search.toString() ? `?${search}` : "");
    const response = await this.fetchFn(url, {
      method,
      headers: {
        Authorization: `Bearer ${this.apiKey}`,
        ...(body === undefined ? {} : { "Content-Type": "application/json" }),
        ...headers,
      },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (response.status >= 400) throw await apiError(response);
    return response;
  }

  /** @internal */
  async json<T>(method: string, path: string,
                options: { body?: unknown; query?: Query; headers?: Record<string, string> } = {}):
      Promise<T> {
    return (await (await this.request(method, path, options)).json()) as T;
  }
}

async function apiError(response: Response): Promise<ApiError> {
  const text = await response.text();
  let error: Record<string, unknown> = {};
  try {
    const parsed = JSON.parse(text) as { error?: Record<string, unknown> };
    error = parsed.error ?? {};
  } catch {
    error = { message: text.slice(0, 500) };
  }
  const { type, reason, message, ...detail } = error;
  return new ApiError(response.status, String(type ?? "unknown"), String(reason ?? "unknown"),
                      String(message ?? response.statusText), detail);
}

/** One session of the key's tenant. */
export class Session {
  constructor(readonly api: Sessionfold, readonly id: string) {}

  private path(tail = ""): string {
    return `/v1/sessions/${encodeURIComponent(this.id)}${tail}`;
  }

  info(): Promise<SessionInfo> {
    return this.api.json("GET", this.path());
  }

  /** Append messages (Anthropic or OpenAI shape); a retried `key` is not appended twice. */
  append(messages: Message[], options: { key?: string; shape?: Shape | "auto" } = {}):
      Promise<AppendResult> {
    return this.api.json("POST", this.path("/messages"), {
      body: { messages, shape: options.shape ?? "auto" },
      headers: options.key ? { "Idempotency-Key": options.key } : {},
    });
  }

  /** The window as it stands (already compacted). */
  window(options: { shape?: Shape; cacheBreakpoints?: boolean } = {}): Promise<Window> {
    return this.api.json("GET", this.path("/window"), {
      query: { shape: options.shape, cache_breakpoints: options.cacheBreakpoints } });
  }

  /** Wait up to `waitS` seconds for the window to move past `etag` (by a fold, or any change).
   *  The new window, or null when the wait ended first. */
  async waitForWindow(etag: string, waitS: number, until: "fold" | "change" = "fold"):
      Promise<Window | null> {
    const response = await this.api.request("GET", this.path("/window"),
                                            { query: { after: etag, wait: waitS, until } });
    return response.status === 304 ? null : ((await response.json()) as Window);
  }

  /** Report a model call's usage for a window read with `window()` (the wrappers and the
   *  guarded request report their own). */
  reportUsage(usage: Record<string, unknown>, seq: number, revision: number, model?: string):
      Promise<{ prompt_tokens: number; published: boolean }> {
    return this.api.json("POST", this.path("/usage"), { body: { usage, seq, revision, model } });
  }

  /** What the recall tool answers now: ledger rows by `seq`, or a `query`. */
  recall(request: { seq?: string | number; offset?: number; query?: string }):
      Promise<RecallAnswer> {
    return this.api.json("POST", this.path("/recall"), { body: request });
  }

  /** Open a model call: the request as the guard sends it. */
  openCall(options: OpenCallOptions = {}): Promise<GuardedRequest> {
    return this.api.json("POST", this.path("/call"), { body: {
      shape: options.shape ?? "anthropic",
      tools: options.tools ?? true,
      ...(options.overBudget ? { over_budget: options.overBudget } : {}),
      ...(options.cacheBreakpoints === undefined ? {}
        : { cache_breakpoints: options.cacheBreakpoints }),
    } });
  }

  /** The model's reply to a guarded request (or its error): what comes next. */
  reply(body: ReplyBody): Promise<CallStep> {
    return this.api.json("POST", this.path("/call/reply"), { body });
  }
}
