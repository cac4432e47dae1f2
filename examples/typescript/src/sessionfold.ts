// A small client of the sessionfold HTTP API: plain fetch, no dependencies.
// Every call sends the bearer key; every error comes back as
// {"error": {"type", "reason", "message"}} and is thrown as an ApiError.

export type Message = { role: "user" | "assistant"; content: unknown };

export interface Window {
  session_id: string;
  system: string;
  revision: number;
  fold_revision: number;
  etag: string;
  last_seq: number;
  tokens: number;
  items: { start_seq: number; end_seq: number; kind: string; tokens: number | null }[];
  messages: Message[];
}

export interface AppendResult {
  first_seq: number;
  last_seq: number;
  revision: number;
  duplicate: boolean;
}

export class ApiError extends Error {
  constructor(readonly status: number, readonly type: string, readonly reason: string,
              message: string) {
    super(`${status} ${reason}: ${message}`);
  }
}

export class Sessionfold {
  constructor(private readonly baseUrl: string, private readonly apiKey: string) {}

  private async request(method: string, path: string, body?: unknown,
                        headers: Record<string, string> = {}): Promise<Response> {
    const response = await fetch(this.baseUrl + path, {
      method,
      headers: {
        Authorization: `Bearer ${this.apiKey}`,
        ...(body === undefined ? {} : { "Content-Type": "application/json" }),
        ...headers,
      },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (response.status >= 400) {
      const payload = (await response.json()) as {
        error?: { type: string; reason: string; message: string };
      };
      const e = payload.error ?? { type: "unknown", reason: "unknown", message: "" };
      throw new ApiError(response.status, e.type, e.reason, e.message);
    }
    return response;
  }

  async createSession(id: string, policy: Record<string, unknown>, system: string):
      Promise<void> {
    await this.request("POST", "/v1/sessions", { id, policy, system, exist_ok: true });
  }

  async append(id: string, messages: Message[], idempotencyKey: string):
      Promise<AppendResult> {
    const response = await this.request("POST", `/v1/sessions/${id}/messages`, { messages },
                                        { "Idempotency-Key": idempotencyKey });
    return (await response.json()) as AppendResult;
  }

  async window(id: string): Promise<Window> {
    const response = await this.request("GET", `/v1/sessions/${id}/window`);
    return (await response.json()) as Window;
  }

  /** Wait up to `waitS` seconds for the window to move past `etag` by a fold (or any change).
   *  Returns the new window, or null when the wait ended first (poll again). */
  async waitForWindow(id: string, etag: string, waitS: number,
                      until: "fold" | "change" = "fold"): Promise<Window | null> {
    const query = new URLSearchParams({ after: etag, wait: String(waitS), until });
    const response = await this.request("GET", `/v1/sessions/${id}/window?${query}`);
    if (response.status === 304) return null;
    return (await response.json()) as Window;
  }

  async reportUsage(id: string, usage: Record<string, number>, seq: number,
                    revision: number, model: string): Promise<void> {
    await this.request("POST", `/v1/sessions/${id}/usage`, { usage, seq, revision, model });
  }
}
