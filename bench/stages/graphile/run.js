// bench/stages: Graphile Worker's side.  N no-op jobs are queued up front
// (as bench/stages queues N messages), then one runner in batched mode
// (a local queue of 500, 10 concurrent jobs, completions batched) works
// them off; prints "seconds jobs".  The connection comes from PGHOST,
// PGPORT, PGUSER and PGDATABASE.
"use strict";
const { Pool } = require("pg");
const { Logger, run, runMigrations } = require("graphile-worker");

// Warnings and errors only, on stderr: stdout carries the result.
const logger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") console.error(`graphile-worker: ${message}`);
});

async function main() {
  const jobs = Number(process.argv[2]);
  if (!Number.isInteger(jobs) || jobs <= 0) throw new Error("usage: run.js JOBS");
  const pgPool = new Pool({ max: 20 });
  pgPool.on("error", (e) => console.error(`pg pool: ${e.message}`));
  const preset = {
    logger,
    worker: {
      concurrentJobs: 10,
      localQueue: { size: 500 },
      completeJobBatchDelay: 0,
      failJobBatchDelay: 0,
      pollInterval: 1000,
    },
  };

  await runMigrations({ pgPool, preset, logger });
  await pgPool.query("TRUNCATE graphile_worker._private_jobs CASCADE");
  await pgPool.query(
    `SELECT graphile_worker.add_jobs(array(
       SELECT json_populate_record(null::graphile_worker.job_spec,
                                   json_build_object('identifier', 'noop', 'payload', '{}'::json))
       FROM generate_series(1, $1)))`,
    [jobs],
  );
  await pgPool.query("VACUUM ANALYZE graphile_worker._private_jobs");
  await pgPool.query("CHECKPOINT");

  let done = 0;
  let finished;
  const allDone = new Promise((resolve) => (finished = resolve));
  const start = process.hrtime.bigint();
  const runner = await run({
    pgPool,
    preset,
    noHandleSignals: true,
    logger,
    taskList: {
      noop: async () => {
        if (++done === jobs) finished();
      },
    },
  });
  await allDone;
  // The last completions are batched: wait until the table is empty.
  for (;;) {
    const { rows } = await pgPool.query("SELECT count(*)::int AS n FROM graphile_worker._private_jobs");
    if (rows[0].n === 0) break;
    await new Promise((r) => setTimeout(r, 5));
  }
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  await runner.stop();
  await pgPool.end();
  console.log(`${seconds.toFixed(3)} ${jobs}`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
