// bench/stages: Graphile Worker's side.  N no-op jobs are queued up front
// (as bench/stages queues N messages), then one runner in batched mode
// (a local queue of 500, 10 concurrent jobs, completions batched) works
// them off; prints "seconds jobs client_cpu_seconds server_cpu_seconds
// wal_bytes wal_flushes" (node's CPU time, the server's processes', the WAL
// written and its fsyncs, over the same span).  The connection comes from
// PGHOST, PGPORT, PGUSER and PGDATABASE.
"use strict";
const { Pool } = require("pg");
const { Logger, run, runMigrations } = require("graphile-worker");
const fs = require("fs");

// The CPU ticks of the server's processes so far (BENCH_POSTMASTER_PID):
// its live children's own, and what the exited ones left in the
// postmaster's cutime and cstime.  bench/stages measures Pepsi's the same way.
function serverTicks() {
  const postmaster = process.env.BENCH_POSTMASTER_PID;
  if (!postmaster) return 0;
  const fields = (pid) => {
    try {
      const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
      return stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    } catch {
      return null; // gone meanwhile
    }
  };
  const own = fields(postmaster);
  let ticks = own ? Number(own[13]) + Number(own[14]) : 0;
  for (const pid of fs.readdirSync("/proc").filter((name) => /^[0-9]+$/.test(name))) {
    const f = fields(pid);
    if (f && f[1] === postmaster) ticks += Number(f[11]) + Number(f[12]);
  }
  return ticks;
}

// Warnings and errors only, on stderr: stdout carries the result.
const logger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") console.error(`graphile-worker: ${message}`);
});

// Where the WAL is, in bytes, and how many times it was flushed so far.
async function walPosition(pgPool) {
  const { rows } = await pgPool.query(
    "SELECT pg_current_wal_lsn() - '0/0' AS bytes, wal_sync AS syncs FROM pg_stat_wal",
  );
  return { bytes: Number(rows[0].bytes), syncs: Number(rows[0].syncs) };
}

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
  const clientStart = process.cpuUsage();
  const serverStart = serverTicks();
  const walStart = await walPosition(pgPool);
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
  const client = process.cpuUsage(clientStart);
  const serverSeconds = (serverTicks() - serverStart) / Number(process.env.BENCH_CLK_TCK || 100);
  const walEnd = await walPosition(pgPool);
  await runner.stop();
  await pgPool.end();
  console.log(`${seconds.toFixed(3)} ${jobs} ${((client.user + client.system) / 1e6).toFixed(3)} ${serverSeconds.toFixed(2)} ${walEnd.bytes - walStart.bytes} ${walEnd.syncs - walStart.syncs}`);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
