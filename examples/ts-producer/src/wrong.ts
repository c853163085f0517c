// Calls the types must refuse: each line under a `@ts-expect-error` is
// wrong, so tsc fails if the types ever stop catching it (an expected error
// that does not happen is itself an error). Never called; only type-checked.

import type { D1Queue, Routes } from "@d1queue/types";
import type { Env } from "./index";

export async function wrongCalls(env: Env, untyped: Service<D1Queue>): Promise<void> {
  // @ts-expect-error a job needs a name
  await env.QUEUE.dispatch("mail", { payload: 1 });
  // @ts-expect-error a name this producer does not push
  await env.QUEUE.dispatch("mail", { name: "mail.sned" });
  // @ts-expect-error an option d1queue does not have (it is delay_s)
  await env.QUEUE.dispatch("mail", { name: "example.echo", delay: 30 });
  // @ts-expect-error priority is a number
  await env.QUEUE.dispatch("mail", { name: "example.echo", priority: "high" });
  // @ts-expect-error a payload must be JSON: a function is not
  await env.QUEUE.dispatch("mail", { name: "example.echo", payload: () => 1 });
  // @ts-expect-error the queue comes first
  await env.QUEUE.dispatch({ name: "example.echo" });
  // @ts-expect-error a batch is an array of jobs
  await env.QUEUE.dispatch_batch("mail", { name: "example.echo" });
  // @ts-expect-error dispatch_job's queue goes in the job, not first
  await env.QUEUE.dispatch_job("mail", { name: "example.echo" });
  // @ts-expect-error dispatch_json takes JSON text
  await env.QUEUE.dispatch_json("mail", { name: "example.echo" });
  // @ts-expect-error an id is a string
  await env.QUEUE.job(42);
  // @ts-expect-error no such method
  await env.QUEUE.push("mail", { name: "example.echo" });
  // @ts-expect-error catch_up is none, latest or all
  await env.QUEUE.put_schedule({ cron: "* * * * *", name: "example.echo", catch_up: "some" });

  const pushed = await untyped.dispatch("mail", { name: "any.name" });
  // @ts-expect-error an id is a string
  const id: number = pushed.id;
  // @ts-expect-error a push answers no state
  void pushed.state;
  const state = await untyped.job(pushed.id);
  // @ts-expect-error a job's state is one of four
  if (state.state === "running") void id;
  const stats = await untyped.stats("mail");
  // @ts-expect-error stats() answers {queues} or one queue's Stats: narrow first
  void stats.ready;
  if (!("queues" in stats)) void stats.ready;

  // HTTP: a body typed from the route table.
  // @ts-expect-error a batch body is {jobs: [...]}
  const batch: Routes["POST /v1/queues/{queue}/jobs/batch"]["body"] = [{ name: "x" }];
  void batch;
  // @ts-expect-error older_than_s is required
  const prune: Routes["DELETE /v1/failed"]["query"] = {};
  void prune;
}
