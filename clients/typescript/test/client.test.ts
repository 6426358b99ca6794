/**
 * The TypeScript client against `feishu-progress serve` in sandbox mode (a subprocess on a free port, a
 * temporary working directory, an API token): create, stream, approve on the card through the sandbox's
 * signed-click endpoint, read the action from the long-poll, finish.
 */

import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { after, before, test } from "node:test";
import assert from "node:assert/strict";

import { ApiError, FeishuProgressClient, type ApprovalPayload } from "../src/client.js";

const REPO = resolve(fileURLToPath(new URL(".", import.meta.url)), "../../../.."); // from dist/test/
const TOKEN = "ts-client-token";
let server: ChildProcess;
let baseUrl: string;

function freePort(): Promise<number> {
  return new Promise((done, fail) => {
    const probe = createServer();
    probe.once("error", fail);
    probe.listen(0, "127.0.0.1", () => {
      const address = probe.address();
      probe.close(() => done(typeof address === "object" && address ? address.port : 0));
    });
  });
}

async function untilServing(url: string): Promise<void> {
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    if (server.exitCode !== null) throw new Error(`serve exited with ${server.exitCode}`);
    try {
      if ((await fetch(`${url}/v1/openapi.json`)).ok) return;
    } catch {
      // not listening yet
    }
    await new Promise((done) => setTimeout(done, 100));
  }
  throw new Error("serve did not answer within 60 s");
}

before(async () => {
  const port = await freePort();
  baseUrl = `http://127.0.0.1:${port}`;
  const env: NodeJS.ProcessEnv = Object.fromEntries(Object.entries(process.env).filter(([key]) => !key.startsWith("FP_")));
  Object.assign(env, { PYTHONPATH: REPO, FP_HTTP__HOST: "127.0.0.1", FP_HTTP__PORT: String(port), FP_ADMIN__PORT: "0",
    FP_LOG_LEVEL: "WARNING", FP_API__TOKEN: TOKEN });
  server = spawn(process.env.PYTHON ?? "python3", ["-m", "feishu_progress", "serve"], {
    env, cwd: mkdtempSync(join(tmpdir(), "fp-ts-")), stdio: ["ignore", "ignore", "inherit"],
  });
  await untilServing(baseUrl);
});

after(async () => {
  server.kill("SIGTERM");
  await new Promise((done) => (server.exitCode !== null ? done(null) : server.once("exit", done)));
});

function buttons(node: unknown, action: string, found: Record<string, unknown>[] = []): Record<string, unknown>[] {
  if (Array.isArray(node)) node.forEach((item) => buttons(item, action, found));
  else if (node && typeof node === "object") {
    const value = (node as { value?: { action?: string } }).value;
    if (value?.action === action) found.push(value as Record<string, unknown>);
    Object.values(node).forEach((item) => buttons(item, action, found));
  }
  return found;
}

test("a task streams, is approved on the card, and finishes", async () => {
  const fp = new FeishuProgressClient(baseUrl, TOKEN);
  const request = { receive_id: "oc_ts", receive_id_type: "chat_id", requester_open_id: "ou_ts", title: "ts" } as const;
  const task = await fp.createTask(request, "ts-task-1");
  assert.equal((await fp.createTask(request, "ts-task-1")).session_id, task.session_id); // same key, same task

  const realFetch = globalThis.fetch;
  const batches: number[] = []; // events per posted batch
  globalThis.fetch = ((input: string, init?: RequestInit) => {
    if (input.endsWith("/events")) batches.push(JSON.parse(String(init?.body)).events.length);
    return realFetch(input, init);
  }) as typeof fetch;
  const events = fp.eventStream(task.session_id, 60_000); // nothing goes out before close()
  events.add({ type: "status", status: "RUNNING", round: 1 });
  for (const word of "Checking the card before deploying".split(" ")) events.add({ type: "content_delta", text: `${word} ` });
  events.add({ type: "tool_started", call_id: "c1", name: "shell", args: { command: "make deploy" } });
  events.add({ type: "tool_finished", call_id: "c1", result: { error: "permission denied" } });
  events.add({ type: "approval", approval_id: "a1", tool_name: "deploy", summary: "deploy to prod", allow_always: true });
  await events.close();
  globalThis.fetch = realFetch;
  assert.deepEqual(batches, [5]); // one batch: status, the five deltas as one, two tool events, the approval

  const view = await fp.getTask(task.session_id);
  assert.equal(view.status, "WAITING");
  assert.ok(JSON.stringify(view.card).includes("Checking the card before deploying"));
  assert.equal(buttons(view.card, "approve").length, 1);
  const approve = buttons(view.card, "approve_always"); // offered: the event said allow_always
  assert.equal(approve.length, 1);
  const click = await fetch(`${baseUrl}/sandbox/api/click`, {
    method: "POST",
    headers: { "Content-Type": "application/json", Authorization: `Bearer ${TOKEN}` },
    body: JSON.stringify({ message_id: task.message_id, value: approve[0] }),
  });
  assert.equal(click.status, 200);

  const actions = fp.actions(task.session_id, 0, 5);
  const action = (await actions.next()).value;
  assert.equal(action?.kind, "approval");
  assert.ok(action?.kind === "approval" && action.payload.approved && action.payload.approval_id === "a1");
  const payload: ApprovalPayload | undefined = action?.kind === "approval" ? action.payload : undefined;
  assert.equal(payload?.always, true);
  assert.equal(action?.operator_open_id, "ou_ts");

  await fp.postEvents(task.session_id, [{ type: "finished", status: "COMPLETED", content: "Deployed." }]);
  assert.equal((await fp.getTask(task.session_id)).status, "COMPLETED");
});

test("a bad event is refused with the field it names", async () => {
  const fp = new FeishuProgressClient(baseUrl, TOKEN);
  const task = await fp.createTask({ receive_id: "oc_ts", receive_id_type: "chat_id", requester_open_id: "ou_ts" });
  const bad = { type: "tool_started", call_id: "", name: "shell" } as const;
  await assert.rejects(fp.postEvents(task.session_id, [bad]), (error: unknown) => {
    assert.ok(error instanceof ApiError);
    assert.equal(error.status, 422);
    assert.equal(error.body.field, "events[0].call_id");
    return true;
  });
  await assert.rejects(new FeishuProgressClient(baseUrl, "wrong").getTask(task.session_id), (error: unknown) =>
    error instanceof ApiError && error.status === 401);
});
