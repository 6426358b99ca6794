/**
 * A typed client of the feishu-progress runtime API, on Node's own fetch (Node 20+).
 *
 * The types come from docs/openapi.json (`npm run generate` → src/schema.d.ts, committed). The wrapper
 * is thin: it retries a 503 after the `retry_after` it names (a bounded number of times), sends an
 * `Idempotency-Key` per event batch (the same on each retry, so a batch whose answer was lost is applied
 * once), coalesces streamed `content_delta`s into few requests, and long-polls the user's actions.
 *
 *   const fp = new FeishuProgressClient("http://127.0.0.1:8000", token);
 *   const task = await fp.createTask({ receive_id: "oc_x", receive_id_type: "chat_id", requester_open_id: "ou_y" });
 *   const events = fp.eventStream(task.session_id);
 *   events.add({ type: "content_delta", text: "Hello" });
 *   await events.close();
 *   for await (const action of fp.actions(task.session_id)) { ... }
 */

import { randomUUID } from "node:crypto";
import type { components } from "./schema.js";

type Schemas = components["schemas"];
export type Event = Schemas["Event"];
export type CreateTaskRequest = Schemas["CreateTaskRequest"];
export type TaskCreated = Schemas["TaskCreated"];
export type TaskView = Schemas["TaskView"];
export type UserAction = Schemas["UserAction"];
/** An approval click: `approved`, and `always` when the user chose 始终允许(本任务) (allow always for this task). */
export type ApprovalPayload = Schemas["ApprovalPayload"];
export type ActionsPage = Schemas["ActionsPage"];
export type ErrorBody = Schemas["ErrorBody"];

export const MAX_EVENTS_PER_BATCH = 1000;
const MAX_TEXT = 1_000_000;

/** The service answered an error: its status, machine code, message and the field it names. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly body: ErrorBody,
  ) {
    super(`${status} ${body.error}: ${body.message}${body.field ? ` (${body.field})` : ""}`);
  }
}

export interface RetryPolicy {
  attempts: number;
  defaultDelayMs: number;
  maxDelayMs: number;
}

const DEFAULT_RETRY: RetryPolicy = { attempts: 5, defaultDelayMs: 1000, maxDelayMs: 30_000 };

interface Request {
  method: "GET" | "POST";
  path: string;
  body?: unknown;
  headers?: Record<string, string>;
}

export class FeishuProgressClient {
  readonly baseUrl: string;

  constructor(
    baseUrl: string,
    private readonly token?: string,
    private readonly retry: RetryPolicy = DEFAULT_RETRY,
  ) {
    this.baseUrl = baseUrl.replace(/\/+$/, "");
  }

  /** Create a task and send its first card; with `idempotencyKey` a repeat is the same task. */
  async createTask(request: CreateTaskRequest, idempotencyKey?: string): Promise<TaskCreated> {
    const headers: Record<string, string> = idempotencyKey ? { "Idempotency-Key": idempotencyKey } : {};
    return (await this.call({ method: "POST", path: "/v1/tasks", body: request, headers })) as TaskCreated;
  }

  /** Post events in order (batches of at most 1000, each applied whole); how many were applied. */
  async postEvents(sessionId: number, events: Event[]): Promise<number> {
    let accepted = 0;
    for (let start = 0; start < events.length; start += MAX_EVENTS_PER_BATCH) {
      const batch = events.slice(start, start + MAX_EVENTS_PER_BATCH);
      const headers = { "Idempotency-Key": `fpts-${randomUUID()}` }; // the same key on every retry
      const path = `/v1/tasks/${sessionId}/events`;
      const answer = (await this.call({ method: "POST", path, body: { events: batch }, headers })) as Schemas["EventsAccepted"];
      accepted += answer.accepted;
    }
    return accepted;
  }

  async getTask(sessionId: number): Promise<TaskView> {
    return (await this.call({ method: "GET", path: `/v1/tasks/${sessionId}` })) as TaskView;
  }

  /** One long-poll: the actions after `after`, waiting up to `waitSeconds` for the first. */
  async pollActions(sessionId: number, after = 0, waitSeconds = 0): Promise<ActionsPage> {
    const path = `/v1/tasks/${sessionId}/actions?after=${after}&wait=${waitSeconds}`;
    return (await this.call({ method: "GET", path })) as ActionsPage;
  }

  /** Every user action after `after`, as it comes (resume with the last action's `cursor`). */
  async *actions(sessionId: number, after = 0, waitSeconds = 30): AsyncGenerator<UserAction> {
    let cursor = after;
    for (;;) {
      const page = await this.pollActions(sessionId, cursor, waitSeconds);
      yield* page.actions;
      cursor = page.cursor;
    }
  }

  eventStream(sessionId: number, flushAfterMs = 250): EventStream {
    return new EventStream(this, sessionId, flushAfterMs);
  }

  private async call(request: Request): Promise<unknown> {
    for (let attempt = 1; ; attempt++) {
      const response = await fetch(this.baseUrl + request.path, {
        method: request.method,
        headers: {
          ...(this.token ? { Authorization: `Bearer ${this.token}` } : {}),
          ...(request.body !== undefined ? { "Content-Type": "application/json" } : {}),
          ...request.headers,
        },
        body: request.body !== undefined ? JSON.stringify(request.body) : undefined,
      });
      const text = await response.text();
      const payload: unknown = text ? safeJson(text) : null;
      if (response.ok) return payload;
      const error = new ApiError(response.status, errorBody(response.status, payload));
      if (response.status !== 503 || attempt >= this.retry.attempts) throw error;
      await sleep(this.delayMs(error, response.headers.get("Retry-After")));
    }
  }

  private delayMs(error: ApiError, header: string | null): number {
    const seconds = error.body.retry_after ?? (header && /^\d+$/.test(header) ? Number(header) : null);
    const wanted = seconds === null || seconds === undefined ? this.retry.defaultDelayMs : seconds * 1000;
    return Math.min(this.retry.maxDelayMs, Math.max(0, wanted));
  }
}

/**
 * Buffers one task's events and posts them in order. Consecutive `content_delta`s become one event, so a
 * model streaming tokens costs a request per `flushAfterMs`, not per token; `finished` flushes at once.
 */
export class EventStream {
  private pending: Event[] = [];
  private timer: NodeJS.Timeout | null = null;
  private sending: Promise<void> = Promise.resolve();
  private failure: unknown = null;

  constructor(
    private readonly client: FeishuProgressClient,
    readonly sessionId: number,
    private readonly flushAfterMs: number,
  ) {}

  add(event: Event): void {
    this.raiseFailure();
    const last = this.pending[this.pending.length - 1];
    if (event.type === "content_delta" && last?.type === "content_delta" && last.text.length + event.text.length <= MAX_TEXT) {
      this.pending[this.pending.length - 1] = { type: "content_delta", text: last.text + event.text };
    } else {
      this.pending.push(event);
    }
    if (event.type === "finished" || this.pending.length >= MAX_EVENTS_PER_BATCH) {
      void this.flush().catch((error: unknown) => (this.failure = error));
    } else if (this.timer === null) {
      this.timer = setTimeout(() => void this.flush().catch((error: unknown) => (this.failure = error)), this.flushAfterMs);
    }
  }

  /** Post what is buffered now, after any batch already on its way. */
  async flush(): Promise<void> {
    if (this.timer !== null) {
      clearTimeout(this.timer);
      this.timer = null;
    }
    const batch = this.pending;
    this.pending = [];
    // A failed batch is raised to its caller; the batches after it still go out.
    this.sending = this.sending.catch(() => undefined).then(async () => {
      if (batch.length > 0) await this.client.postEvents(this.sessionId, batch);
    });
    await this.sending;
  }

  /** Flush and wait for every batch; raises a batch's failure. */
  async close(): Promise<void> {
    await this.flush();
    this.raiseFailure();
  }

  private raiseFailure(): void {
    const failure = this.failure;
    this.failure = null;
    if (failure !== null) throw failure;
  }
}

function safeJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

function errorBody(status: number, payload: unknown): ErrorBody {
  if (payload && typeof payload === "object" && "error" in payload && "message" in payload) {
    return payload as ErrorBody;
  }
  return { error: `http_${status}`, message: typeof payload === "string" ? payload.slice(0, 200) : "" } as ErrorBody;
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
