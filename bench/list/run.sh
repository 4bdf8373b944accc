#!/usr/bin/env bash
# bench/list: mailing lists, Pepsi against mlmmj + a stock Postfix, side by
# side on this machine, on a simulated internet (as bench/relay-internet):
# SUBSCRIBERS (10,000) subscribers spread over DOMAINS (500) domains whose
# MX records spread them over 20 MX hosts, each a Postfix smtp-sink on
# 127.0.0.140-159 port 25, all served by one DNS server on 127.0.0.199:53
# (t/lib/testdns.py).
#
#   big:   one post of 20 KB (BENCH_POST_SIZE) to the SUBSCRIBERS list
#   small: POSTS (1,000) posts to a list of SMALL (100) subscribers spread
#          over SMALL_DOMAINS (20) domains
# each in both modes:
#   verp:  a copy per subscriber, on its own return path (Pepsi: one row
#          per subscriber; mlmmj: control/verp "postfix", one transaction
#          of 100 recipients with XVERP to Postfix, which makes the
#          copies)
#   plain: Pepsi one row per destination domain; mlmmj its default,
#          which is a copy per subscriber on its own return path
#          (list+bounces-N-user=domain: mlmmj's bounce handling), one
#          transaction per subscriber as with VERP
#
#   pepsi:  post.py -> pepsi-ingress -> pepsi-stage-list (fan-out) ->
#           relay-to-internet (MX through DNS_FORWARDER = the DNS server)
#           -> the MX hosts; the queue a durable cluster (bench/lib.sh)
#   mlmmj:  post.py -> a private stock Postfix -> pipe transport
#           mlmmj-receive (as the unprivileged user) -> mlmmj-send ->
#           relayhost = that same Postfix's smtpd -> the MX hosts, its
#           smtp client resolving MX records through the same DNS server
#           (chrooted in its queue directory, whose etc/resolv.conf names
#           127.0.0.199: no transport map)
#
# The time runs from the first post sent to the last copy the MX hosts
# received (counted in SMTP transactions: the number each side must make
# is computed from the subscribers and the batching).  The sides
# alternate (pepsi, mlmmj for each case) BENCH_REPEATS times (5); each
# run's times and ratio mlmmj/pepsi are printed, then the medians, the
# spread (min .. max) and the median ratio (target >= 3).  One unmeasured
# warm-up run of each side first.  The load average is printed.
#
# BENCH_SUBSCRIBERS, BENCH_DOMAINS, BENCH_POSTS, BENCH_SMALL,
# BENCH_SMALL_DOMAINS, BENCH_REPEATS, BENCH_CASES ("big small"),
# BENCH_MODES ("verp plain"), BENCH_RELAY_WORKERS (30) make it smaller;
# BENCH_RELAY_QUEUE_LIMIT sets the relay stage's QUEUE_LIMIT (its default,
# 16, when unset).
# BENCH_WARMUP=0 skips the warm-up runs; BENCH_SAVE=DIR keeps the logs
# (Pepsi's, PostgreSQL's, Postfix's maillog) in DIR.
#
# For profiling Pepsi: BENCH_PEPSI_ONLY=1 runs Pepsi's side alone (no
# mlmmj run, no ratio); BENCH_PERF=DIR records perf (perf record,
# system-wide off: only the processes of PostgreSQL's and Pepsi's trees
# as they are when the run starts, the workers and their backends being
# up after the warm-up) during each measured Pepsi run, into
# DIR/perf.CASE.MODE.RUN (read with perf report -i FILE --sort comm,dso,sym;
# BENCH_PERF_OPTS adds options, e.g. "--call-graph dwarf").
# BENCH_STATEMENTS=1 loads pg_stat_statements (track = all) and writes,
# after each measured Pepsi run, its 30 costliest statements (calls,
# plans, planning and execution time, pages dirtied, WAL records) to statements.CASE.MODE.RUN.log among
# the logs (keep them with BENCH_SAVE).
#
# BENCH_MLMMJ_WINDOW=S bounds each mlmmj + Postfix run to S seconds (a
# full run at the issue's size is 10 .. 100 minutes): if its transactions
# are not all in by then, it is stopped, both queues emptied, and the
# figure printed is a LOWER BOUND, marked ">=" and "LOWER BOUND": the
# seconds elapsed plus the transactions left at the fastest rate seen in
# any 5 s span of the window (with the count and that rate); the ratio
# from it is a lower bound too.  Pepsi's side always runs to the end.
#
# mlmmj 1.3.0 + Postfix 3.7, what they do here (from Postfix's maillog
# and mlmmj-send's source): mlmmj-send makes ONE connection at a time to
# Postfix (forking more was removed in mlmmj 1.0), a new one per 100
# subscribers (maxverprecips), and in its default mode one transaction
# per subscriber on its own return path, with no pipelining, the body
# written a line per write(2), replies read a byte per read(2), and
# Postfix's cleanup fsyncing each copy before its 250: its rate is that
# of one transaction after another.  In VERP mode (control/verp
# "postfix") it sends one transaction of 100 recipients with XVERP and
# Postfix makes the copies; Postfix accepts XVERP only from
# smtpd_authorized_verp_clients, empty by default in Postfix 3.x, which
# mlmmj's documentation says to set, so the bench sets it to loopback.
# (Until 2026-12-07 control/verp held "mlmmj": Postfix answered the
# probe "555 5.5.4 Unsupported option", mlmmj fell back to its default,
# and every "verp" figure of mlmmj before then is its plain mode.)
#
# Run as root (ports 25 and 53 on loopback addresses; postfix).
#
# Figures: see the end of this comment (recorded runs).
#
# Recorded 2026-12-06 (2 cores, shared; load 6.3 before, 15.2 after), NOT
# the issue's size: BENCH_SUBSCRIBERS=1000 BENCH_DOMAINS=50 BENCH_POSTS=10
# BENCH_SMALL=100 BENCH_SMALL_DOMAINS=20 BENCH_REPEATS=3 (medians of 3, not
# 5; seconds to the last delivery, min .. max; ratio mlmmj+postfix/pepsi):
#   big verp    pepsi 11.51 (7.37 .. 17.10)  mlmmj 54.22 (52.09 .. 56.96)  ratio 4.53 (3.33 .. 7.36)
#   big plain   pepsi  1.34 (1.27 .. 1.43)   mlmmj  1.54 (1.44 .. 1.81)    ratio 1.08 (1.07 .. 1.43)
#   small verp  pepsi  7.78 (7.52 .. 10.07)  mlmmj  9.43 (9.17 .. 11.75)   ratio 1.22 (0.94 .. 1.51)
#   small plain pepsi  3.61 (3.34 .. 5.32)   mlmmj  3.33 (2.89 .. 3.57)    ratio 0.87 (0.67 .. 0.92)
# The 3x target is met only for the big VERP fan-out at this size.
#
# Recorded 2026-12-07 at the issue's size for the big plain case only
# (10,000 subscribers over 500 domains, BENCH_CASES=big BENCH_MODES=plain,
# 5 runs after a warm-up; the extension with the shared-body release of
# that day), on 2 cores beside a background benchmark (about a core) and
# other helpers' builds and tests: load 10.5 before, 18.6 .. 23.8 during:
#   big plain   pepsi  8.18 (7.59 .. 13.73)  mlmmj  8.02 (7.02 .. 15.26)   ratio 0.98 (0.76 .. 1.29)
# Both sides make 500 transactions here (Pepsi one row per domain; mlmmj
# 100 batches of 100, about 5 domains each); 60 rows/s for Pepsi with 30
# relay workers on a machine at load 20.  Big verp, small verp and small
# plain were not run at the issue's size: one big verp run of mlmmj takes
# about 10 minutes (10,000 transactions into Postfix, about 18/s), the
# small cases at 1,000 posts 100,000 and 20,000 transactions a side.
# A development run (Pepsi alone, 1,000 subscribers, verp, load 30 .. 50)
# showed where Pepsi's big verp time went: every row's commit waited on
# the shared body's row lock (workqueue_commit 57 ms a call, all 1,000
# rows' commits one after another); with the release of 2026-12-07 2.9 ms.
#
# Where Pepsi's time went, 2026-12-07, big plain at the issue's size
# (500 rows of 20 recipients), commit 7ba48ec, Pepsi alone with
# pg_stat_statements (track = all, track_planning) and perf in the bench's
# cluster, 13 runs at load 8 .. 36 (others' builds and tests): 4.1 .. 22.0 s
# a run.  The machine had no idle tick during any run, so wall time
# followed the CPU each side used and got.  CPU seconds a run, by process
# tree: PostgreSQL 1.1 .. 2.1, Pepsi's processes (dispatcher, list stage,
# 30 relay workers) 0.8 .. 1.3, the DNS server 0.4 .. 0.7 (about 1,000
# queries: each row's MX and _mta-sts TXT, the workers' caches being
# their own), the sinks 0.3; mlmmj + Postfix's side, measured alike, 2.7
# (Postfix, mlmmj-send) + 0.6 (DNS, as many queries) + 0.3 (sinks): both
# sides use about the same CPU, which is why the ratio stays near 1.  A
# row waited at the relay stage for most of the run (the queue part of
# delay= grows linearly to the run's end) and spent 0.4 .. 1.0 s in its
# pass before connecting (load, DNS, destination_begin, starved of CPU);
# the SMTP part 0.00 .. 0.01 s.  In PostgreSQL (perf): planning 22% of
# its CPU, parsing 9%, commits 11%, the claim 12%, workqueue_commit 9%
# (its body-release trigger 5%), destination_begin 7%.  The relay's
# prepared load over an array of one id was planned at every execution
# (501 plans for 501 loads, 152 ms planning against 104 ms executing),
# as was the claim's check of which stages have pending rows (293 plans,
# 96 ms against 27 ms): both keep their generic plan from commit 167fc04
# on.  workqueue_commit's DELETE took 1.5 .. 2.1 ms a row, mostly waiting
# for other workers' body releases, which lock one running row of the
# shared body FOR SHARE (23 waits over 10 ms a run).
#
# Recorded 2026-12-07, big plain at the issue's size (BENCH_CASES=big
# BENCH_MODES=plain, 5 runs after a warm-up), one hold of the lock, the
# baseline then the loads of one row by id and the claim's generic check:
#   7ba48ec  pepsi 11.06 (9.63 .. 14.87)  mlmmj  10.00 (8.57 .. 13.53)  ratio 0.94 (0.64 .. 1.22)  load 33.4 -> 43.9
#   167fc04  pepsi  9.32 (7.19 .. 11.17)  mlmmj   7.78 (5.30 .. 14.24)  ratio 0.89 (0.47 .. 1.62)  load 27.5 -> 34.8
# At load 25 .. 44 on 2 cores the spread of either side is wider than any
# difference: no change of the ratio can be read from these.  The change
# removes 500 plannings of the load and about 300 of the claim's check a
# run (pg_stat_statements: about 0.25 s of planning, timed under that
# load, beside the backends' 1.1 .. 2.1 CPU seconds).
#
# Recorded 2026-12-07 under the lock with autogroup scheduling off (the
# others' work at nice 19 yields to the benchmark's; load average 9 .. 60,
# nearly all of it niced), BENCH_MODES=plain, 5 runs after a warm-up:
#   11fd102  big plain   pepsi 1.77 (1.65 .. 1.90)  mlmmj 6.73 (5.03 .. 13.76)  ratio 3.80 (2.87 .. 7.24)  load 12.5 -> 13.0
#   c673aeb  big plain   pepsi 2.04 (1.78 .. 2.39)  mlmmj 6.90 (5.25 .. 13.12)  ratio 3.33 (2.71 .. 5.49)  load 38.2 -> 35.1
#   c673aeb  small plain pepsi 11.49 (11.19 .. 12.56) mlmmj 15.66 (11.40 .. 20.61) ratio 1.25 (1.02 .. 1.67)  load 54 -> 59
# (small at BENCH_POSTS=200, not 1,000: at 1,000 posts the twelve runs
# would hold the shared lock for about 25 minutes.)  These ratios, and
# every plain ratio recorded above, are VOID: mlmmj's default sends each
# subscriber a copy of its own (return path list+bounces-N-user=domain,
# nrcpt=1 in Postfix's maillog), 10,000 transactions for the big post,
# 100 for a small one, but its plain runs were counted as batches of 100
# recipients split by domain (500 for big, 20 for small).  So its clock
# stopped at the 500th transaction of 10,000 (the 20th of 100 a small
# post), and the rest ran on into the following runs, Pepsi's included:
# the CPU each process tree used (printed from c673aeb on) showed
# Postfix and mlmmj using 0.2 .. 0.8 CPU seconds during each of Pepsi's
# big runs, rising run by run while mlmmj's time fell (28.5 s warm-up,
# then 13.1, 9.2, 6.9, 5.5, 5.3), 10.6 .. 12.5 during Pepsi's small
# runs, and Pepsi 3.4 .. 4.9 during mlmmj's (its own clock stopped early
# by mlmmj's late transactions).  One big plain post took mlmmj + Postfix
# 4 minutes for its first 3,880 transactions (16 a second).  From 9c42b83
# on mlmmj's transactions are counted one per subscriber and every run
# first waits for both queues to empty (settle, fa7713b).
# What Pepsi's side shows, big plain at the issue's size: its processes
# used 2.0 .. 2.4 CPU seconds a run (PostgreSQL 0.73 .. 0.96, Pepsi
# 0.72 .. 0.97, the DNS server 0.33 .. 0.40, the sinks 0.21 .. 0.29) in
# 1.8 .. 2.4 s on 2 cores, beside Postfix's leftovers: about half the
# machine.
#
# Recorded 2026-12-07, 9631c22 (mlmmj counted one transaction per
# subscriber, each run after settle), under the lock, load 19.3 before,
# 14.2 .. 16.6 during (others' work at nice 19), NOT the issue's size:
# BENCH_SUBSCRIBERS=1000 BENCH_DOMAINS=50 BENCH_CASES=big
# BENCH_MODES=plain, 5 runs after a warm-up (an mlmmj run at 10,000
# subscribers takes about 10 minutes: six would hold the lock an hour):
#   big plain   pepsi 0.91 (0.74 .. 1.07)  mlmmj 59.68 (57.65 .. 62.53)  ratio 68.71 (55.61 .. 81.72)
# No side used CPU in the other's runs any more (Postfix 0.00 in each of
# Pepsi's).  Pepsi: 50 transactions, 0.44 .. 0.59 CPU seconds a run
# (PostgreSQL 0.23 .. 0.29, Pepsi 0.16 .. 0.23, DNS 0.05, sinks 0.03) in
# 0.74 .. 1.07 s: latency, not CPU (ingress, the list stage's fan-out,
# then one pass of the relay workers).  mlmmj + Postfix: 1,000
# transactions at 16 .. 17 a second, 7.8 .. 9.5 CPU seconds (Postfix and
# mlmmj 5.6 .. 7.0, DNS 1.2 .. 1.5, sinks 0.4 .. 0.5) in 58 .. 63 s, so
# latency-bound too: mlmmj-send hands Postfix one copy at a time.  At
# the issue's size that is 10,000 transactions, about 600 s (the void
# run above saw 3,880 in its first 4 minutes), against Pepsi's 1.8 ..
# 2.4 s at 500 rows: the 3x target is met for big plain by two orders of
# magnitude, because mlmmj's default sends a copy per subscriber and
# Pepsi's plain mode one per domain.  Small plain (1,000 posts of 100
# recipients over 20 domains: mlmmj 100,000 transactions, Pepsi 20,000
# rows) was not run with the corrected count: mlmmj alone would take
# about 100 minutes a run.
#
# Recorded 2026-12-07, 7f0230b, small plain at BENCH_POSTS=10 (not
# 1,000; 100 subscribers over 20 domains: Pepsi 200 rows, mlmmj 1,000
# transactions), 5 runs after a warm-up, under the lock, load 6.9 before,
# 8.1 .. 13.2 during:
#   small plain pepsi 1.17 (1.02 .. 1.27)  mlmmj 12.02 (11.27 .. 12.36)  ratio 10.27 (9.63 .. 12.12)
# CPU a run: Pepsi 0.93 .. 1.23 (PostgreSQL 0.49 .. 0.56, Pepsi 0.27 ..
# 0.38, DNS 0.00 .. 0.14: the workers' own caches answer the repeated
# domains, sinks 0.07 .. 0.15) in 1.0 .. 1.3 s; mlmmj + Postfix 9.0 ..
# 10.3 (Postfix and mlmmj 7.0 .. 7.9, DNS 1.4 .. 1.6, sinks 0.5 .. 0.6)
# in 11.3 .. 12.4 s, its ten mlmmj-send side by side: both near half the
# two cores, the ratio that of the work (Pepsi 200 transactions of 5
# recipients, mlmmj 1,000 of one).
#
# Why mlmmj + Postfix makes about 20 transactions a second here (checked
# 2026-12-07): it is their stock behaviour, not the set-up's.  Postfix's
# maillog: smtpd took 19 .. 22 of mlmmj's transactions every second,
# steadily (no stretches of one a second, so in_flow_delay never held
# cleanup: an strace of every cleanup for 40 s showed no doze), and each
# copy left Postfix about 0.1 s after it came in (delays= 0.048 before
# the queue manager, 0.000 in it, 0.001 connecting, DNS lookups
# included, 0.049 sending: the resolver answers, nothing times out;
# name lookups of the host are /etc/hosts ones).  The work waits on
# mlmmj-send: one connection, one transaction after another (see above),
# about 47 ms each on an idle machine, mlmmj + Postfix using 6.2 .. 6.9
# CPU seconds in a 30 s window of 2 cores (DNS and sinks included): the
# chain is latency-bound, not CPU-bound.  No 40 ms Nagle stall was seen
# (smtpd read the final dot within 8 ms of mlmmj writing it, under
# load); Postfix's cleanup fsyncs each copy (5 ms a fsync here).
#
# Recorded 2026-12-07, 1da3ffe, under the lock, at the issue's size:
# big plain, one post of 20 KB to 10,000 subscribers over 500 domains
# (Pepsi 500 transactions, one per domain; mlmmj 10,000, one per
# subscriber), BENCH_CASES=big BENCH_MODES=plain BENCH_MLMMJ_WINDOW=30,
# 5 runs after a warm-up, load 18.1 before (the previous holder's run), 7.0 ..
# 2.4 during:
#   big plain   pepsi 2.33 (2.05 .. 2.57)  mlmmj >= 474.58 (469.51 .. 488.32)  ratio >= 203.68 (182.69 .. 237.29)
# mlmmj's figures are LOWER BOUNDS, not measured: in each 30 s window it
# completed 593 .. 626 of the 10,000 transactions, at a peak of 20.52 ..
# 21.35 a second over 5 s; run 1: 30.21 s + (10,000 - 623) / 21.35 =
# 469.5 s (10,000 / 21.35 = 468 s alone).  A full run would hold the
# lock about 8 minutes a run.  CPU a run: Pepsi 2.6 .. 3.5 s (PostgreSQL
# 1.1 .. 1.4, Pepsi 0.9 .. 1.2, DNS 0.4 .. 0.5, sinks 0.2 .. 0.4); mlmmj +
# Postfix 4.4 .. 5.1 in its window (DNS 1.0 .. 1.2, sinks 0.2 .. 0.3).
# The queues were empty before every run (settle), nothing leaked.
#
# Recorded 2026-12-07, 1da3ffe, under the lock, big verp at the issue's
# size (Pepsi 10,000 rows; mlmmj 100 transactions of 100 recipients with
# XVERP, Postfix 10,000 copies: maillog nrcpt=100 for each of mlmmj's
# 600 messages over the six runs), BENCH_CASES=big BENCH_MODES=verp
# BENCH_MLMMJ_WINDOW=30, 5 runs after a warm-up, load 13.2 before, 13.4
# .. 16.2 during (others' niced work):
#   big verp    pepsi 16.71 (14.82 .. 22.00)  mlmmj 30.67 (24.45 .. 34.65)  ratio 1.90 (1.26 .. 2.07)
# Runs 1 .. 3 of mlmmj measured (27.82, 24.45, 30.67 s); runs 4 and 5
# LOWER BOUNDS (9,600 of 10,000 in 30.82 s, then 400 at 347.49/s:
# >= 31.98 s; 8,843 in 31.19 s, then 1,157 at 333.88/s: >= 34.65 s), so
# their ratios (>= 1.90, >= 2.07) are lower bounds too; the median
# ratio is the third of five either way.  The 3x target is NOT met for
# big verp.  Both sides were CPU-bound on the 2 cores: Pepsi 25.9 ..
# 34.5 CPU seconds a run (PostgreSQL 11.9 .. 15.4, Pepsi 10.1 .. 12.2,
# DNS 0.5 .. 4.4, sinks 2.4 .. 2.8), mlmmj + Postfix 44.1 .. 52.9
# (Postfix and mlmmj 31.6 .. 37.7, DNS 9.2 .. 11.2, sinks 2.9 .. 3.5).
# Postfix asks the tests' DNS server (Python) for every copy's MX and A
# records, 9 .. 11 CPU seconds a run that a caching resolver, as a real
# Postfix host has, would mostly save (Pepsi's workers cache their own):
# the set-up costs the peer here, so the ratio overstates Pepsi's lead.
# Small plain and small verp (1,000 posts x 100 subscribers) were not
# recounted at the issue's size this day (no hold of the lock left).
#
# Where Pepsi's CPU goes per VERP row, 2026-12-07 (Pepsi alone,
# BENCH_PEPSI_ONLY=1, perf of PostgreSQL's and Pepsi's processes with
# BENCH_PERF, 2,000 subscribers over 100 domains, load 7 .. 14): each row
# is claimed, loaded (body included), begun at its destination
# (pepsi.destination_begin) and committed on its own, one row a pass
# (relay-to-internet has no batch): PostgreSQL 3.8 .. 4.7 CPU s per 2,000
# rows (1.9 .. 2.3 ms a row), Pepsi 3.2 .. 3.8 (1.6 .. 1.9 ms: its
# relay workers), DNS 0.7 .. 1.1, sinks 0.7 .. 0.9.  SMTP sessions ARE
# reused: 3,447 of 4,000 deliveries' connect delay 0.00 (delays=
# a/b/c/d).  In a relay worker (perf, call graphs): 36% of its CPU was
# DNS for answers libunbound already had, the blocking resolver having no
# cache of its own (each row's MX and _mta-sts TXT lookup crossed to
# libunbound's thread and back: 23.5% in that thread, 12.6% in
# dns_resolve_sync); the database round trips (destination_begin, the
# load, the commit) 18%; option lookups by name (config_number_for,
# linear strcmp) 6.5%; SMTP I/O about 10%.  The list stage signs
# nothing: this bench's graph has no dkim-sign; the documented list
# graph (pepsi-stage-list(8): list -> sign -> route) signs each VERP row
# after the fan-out, which VERP's per-subscriber List-Unsubscribe (to be
# covered by the signature for RFC 8058) requires.
# With the blocking resolver's cache (882deab; before = 8674074,
# main then), big verp at the issue's
# size, Pepsi alone, 3 runs after a warm-up each, under the lock, one set
# after the other (after first, load 10.8 -> 16.5; before, load 10.2 ->
# 22.8):
#   before  pepsi 18.44 s (16.35 .. 19.29)  CPU a run: Pepsi 10.57 .. 13.05, PostgreSQL 13.00 .. 15.86, DNS 1.93 .. 4.22, all 28.5 .. 34.0
#   after   pepsi 14.41 s (13.53 .. 17.02)  CPU a run: Pepsi  7.76 ..  9.53, PostgreSQL 11.91 .. 13.37, DNS 1.41 .. 3.83, all 23.4 .. 29.1
# Pepsi's processes use about a quarter less CPU (0.78 .. 0.95 ms a row
# against 1.06 .. 1.31); the time's spread overlaps, 3 runs a side.
# Recorded 2026-12-07, 5317a5e, small at the issue's size (1,000 posts
# to 100 subscribers over 20 domains), BENCH_MLMMJ_WINDOW=60, 5 runs a
# mode over several holds of the lock (a 15-minute hold fits about four
# small plain or three small verp pairs): plain a warm-up + 3 runs
# (14:15-14:27, load 7.3 -> 32.8) then 2 runs with BENCH_WARMUP=0 on a
# fresh cluster (14:27-14:32, load 23.9 -> 22.2); verp a warm-up + 1 run
# (14:32-14:39, load 16.3 -> 38.7), then twice 2 runs with BENCH_WARMUP=0
# (14:40-14:48, load 16.2 -> 38.1; 14:48-14:57, load 22.1 -> 46.7);
# medians of the 5 (min .. max), others' niced builds and tests beside:
#   small plain pepsi  51.93 (40.10 .. 57.68)   mlmmj >= 676.96 (581.83 .. 826.60)  ratio >= 14.08 (11.70 .. 14.51)
#   small verp  pepsi 164.96 (130.60 .. 177.06) mlmmj >= 903.81 (778.06 .. 952.68)  ratio >=  5.77 (5.10 .. 7.14)
# Every mlmmj figure is a LOWER BOUND from its 60 s window: plain 5,864
# .. 8,733 of 100,000 transactions in it, at a peak of 123 .. 175 a
# second (its 1,000 posts' mlmmj-send run side by side, unlike the big
# case's one); verp 3,472 .. 5,646, at 108 .. 132 a second.  Pepsi's
# CPU a run: plain 63 .. 85 s (PostgreSQL 37 .. 51, Pepsi 19 .. 25),
# verp 226 .. 252 s (PostgreSQL 125 .. 137, Pepsi 66 .. 75, sinks 23 ..
# 27): both CPU-bound on the 2 cores.  The verp bound is weaker than the
# plain one: in its window Postfix may still be taking in the 1,000 posts and
# mlmmj-send's batches while it makes copies, so its copy rate may rise
# once they are in; the big verp runs above made 330 copies a second,
# and at 330 a second 100,000 copies would take about 300 s (ratio about
# 1.8 at Pepsi's median).  Whether small verp meets 3x needs a full
# mlmmj run (or a window past the posts' intake), not measured here.
# (Postfix's CPU of 11 .. 12 s shown in some verp Pepsi runs is its
# processes of the window before exiting at max_idle, counted then.)
#
# Recorded 2026-12-07, 8da26ca (relay-to-internet batches of up to 8 rows:
# one load, one commit of the deliveries; a run of deliveries to one
# domain asks destination_begin once; destination_begin answers the TLS
# result recorded, so a worker that got the same writes no
# destination_end; the VERP fan-out grouped by domain; option
# definitions found by name once), under the lock, big verp at the
# issue's size, BENCH_CASES=big BENCH_MODES=verp BENCH_MLMMJ_WINDOW=90,
# 5 runs after a warm-up, load 14.1 before, 13.5 .. 16.0 during (others'
# niced work); every mlmmj run measured to its end inside the window:
#   big verp    pepsi 16.12 (13.25 .. 18.22)  mlmmj 25.83 (25.61 .. 28.46)  ratio 1.68 (1.42 .. 2.15)
# The 3x target is NOT met.  CPU a run: Pepsi's side 20.3 .. 28.4 s
# (PostgreSQL 11.0 .. 13.8, Pepsi 6.2 .. 8.7, DNS 0.9 .. 4.6, sinks 2.0
# .. 2.4), mlmmj + Postfix 45.0 .. 50.2 (Postfix and mlmmj 32.2 .. 35.8,
# DNS 9.2 .. 10.7, sinks 2.9 .. 3.5): both sides CPU-bound on 2 cores.
# Against 1da3ffe's record above (PostgreSQL 11.9 .. 15.4, Pepsi 10.1 ..
# 12.2), Pepsi's own processes use less, PostgreSQL about the same.
# At 2,000 subscribers over 100 domains (Pepsi alone, 3 runs after a
# warm-up, load 5 .. 9, pg_stat_statements on): main 5317a5e 4.33 s
# (3.91 .. 5.73; PostgreSQL 2.8 .. 3.6 CPU s, Pepsi 1.8 .. 2.6), 8da26ca's
# code 3.35 s (3.28 .. 3.42; PostgreSQL 2.0 .. 2.3, Pepsi 1.4); statements
# a run of 2,000 rows: loads and commits 2,000 -> about 870 each (600
# of them batches of 2.9 rows on average), destination_begin 2,000 ->
# 1,250, destination_end 1,440 -> 385.
# At the issue's size, Pepsi alone (BENCH_PEPSI_ONLY=1, 3 runs after a
# warm-up each, one hold of the lock, main first; pg_stat_statements on
# for both), load 14.3 -> 17.4 (main), 13.6 -> 23.7 (8da26ca):
#   main 5317a5e  pepsi 14.96 s (12.57 .. 20.12)  CPU a run: PostgreSQL 11.2 .. 16.1, Pepsi 7.1 .. 10.9, all 21.6 .. 34.1
#   8da26ca       pepsi 14.93 s (13.47 .. 15.87)  CPU a run: PostgreSQL  9.9 .. 12.0, Pepsi 6.4 ..  7.6, all 20.9 .. 24.8
# No gain in wall time can be read from these (the spreads overlap); the
# CPU a run is lower by up to a quarter.  Statements per 10,000 rows:
# destination_end 9,540 -> 2,040, destination_begin 10,000 -> 6,650,
# loads and commits 10,000 -> 4,720 each (3,030 batches of 2.7 rows).
# What that run showed is left: (1) with the fan-out grouped by domain,
# the workers that start on a domain at once all find no pepsi.destination
# row yet and write the TLS result, and destination_end's INSERT ... ON
# CONFLICT DO NOTHING waits for the first one's commit (6.9 ms a call,
# 56 s of the workers' time over the four runs, against 0.07 ms on main,
# whose fan-out spread each domain's rows); (2) relay-to-internet's pool
# now batches, so with a light lane (the default) its workers run at
# BULK_NICE, as relay-to-smarthost's do (pepsi.session_nice, 30 calls
# taking 0.65 s each at the workers' start); (3) PostgreSQL's CPU per row
# at this size (1.0 .. 1.2 ms) is still most of Pepsi's side: the claim,
# the body release's FOR SHARE scan of the rows sharing the post's body,
# the DELETEs; no profile of it at this size was taken.
#
# Recorded 2026-12-07 16:11-16:20, 5e56b28 (relay-to-internet's batches
# merged), small verp at the issue's size with mlmmj measured to its end
# (BENCH_CASES=small BENCH_MODES=verp BENCH_REPEATS=1 BENCH_WARMUP=0
# BENCH_MLMMJ_WINDOW=1500), ONE run a side, nothing else running (load
# 0.5 before, 10.0 after):
#   small verp  pepsi 148.33 s  mlmmj 386.41 s  ratio 2.61
# The 3x target is NOT met, and the 60 s window's bounds above (>= 778
# .. 953 s) were far too high: in a full run mlmmj + Postfix made the
# 100,000 copies at 259 a second on average, against 108 .. 132 in the
# windows' first minute (Postfix still taking in the posts then).  CPU:
# Pepsi's side 242.5 s (PostgreSQL 150.6, Pepsi 62.4, sinks 28.5),
# mlmmj's 712.5 s (Postfix and mlmmj 538.1, DNS 132.7, sinks 34.7).
#
# Where PostgreSQL's CPU per VERP row went, 2026-12-07, main 83aa7a9,
# 2,000 subscribers over 100 domains, Pepsi alone (BENCH_STATEMENTS=1 and
# BENCH_PERF with call graphs, 3 runs, load 11 .. 13): PostgreSQL 2.8 ..
# 3.3 CPU s a run (1.4 .. 1.6 ms a row, perf and pg_stat_statements on).
# Of the server's samples: planning 12% (pg_plan_query), half of it the
# relay workers' batch loads, planned afresh at each of the 586 loads a
# run (an array parameter of known length always makes the custom plan
# look cheaper), most of the rest workqueue_commit_many's DELETE, planned
# at each of its 586 calls for the same reason (4% of the server's CPU,
# more than executing it), and the claim's UPDATE (566 plans);
# ExecutorStart 11%; the claim 9%, destination_begin 9% (1,208 calls),
# destination_end 7% (347 calls); commits 7%; the shared body's release 3%
# (879 FOR SHARE lookups, two WAL records each).  destination_end's
# INSERT ... ON CONFLICT DO NOTHING took 10.2 ms a call (347 calls, 99
# rows written): the workers starting on a domain at once each waited
# for the first one's commit.  Changed (commits 87e4905 .. 6d02b67):
# workqueue_commit_many and the claim's UPDATE keep their generic plan
# (nested loop over the unnest, rows by primary key), the batch loads
# pad their ids to the ten elements the planner assumes for an unknown
# array so that the plan cache keeps the generic plan, and destination_end
# writes a new destination's TLS result under a transaction advisory lock
# the others skip.  pg_stat_statements after, per run: the load planned
# 30 times (once per worker session) instead of 586, the commit's DELETE
# 30 instead of 586, the claim's UPDATE once; destination_end 2.4 ms a
# call instead of 11.4, its INSERT reached 175 times at 2.7 ms.
# Before/after at that size, Pepsi alone (BENCH_REPEATS=4 after a warm-up,
# one hold of the lock 18:09-18:12, load 28 .. 35: others' niced tests
# and builds, and mine):
#   83aa7a9  pepsi 4.08 s (3.89 .. 4.42)  CPU a run: PostgreSQL 2.07 .. 2.40 (median 2.25), Pepsi 1.15 .. 1.66, all 3.98 .. 5.33
#   6d02b67  pepsi 4.18 s (3.97 .. 4.60)  CPU a run: PostgreSQL 1.99 .. 2.23 (median 2.09), Pepsi 1.31 .. 1.73, all 4.19 .. 5.47
# PostgreSQL's CPU a row 1.04 .. 1.20 ms before, 1.00 .. 1.12 after (about
# 7% less at the median, within the spread); the wall time does not move.
# The plans saved are real but small beside what is left: a row still
# costs a claim (an UPDATE), a load, a destination_begin (1,193 calls for
# 2,000 rows: the batches rarely share a domain, the dispatcher handing
# consecutive rows round-robin), a batch DELETE with its body release
# (one FOR SHARE lookup per statement, already one per distinct body),
# and three or four transactions' commits.  Not changed: the release
# protocol (3% of the server here), relay-to-internet's BULK_NICE, the
# dispatcher's round-robin hand-out (grouping a domain's rows in one
# worker's batch would save most destination_begin calls and SMTP
# session switches: the next lead).
# At the issue's size with mlmmj, b15da73 (the changes above), under the
# lock 18:31-18:38, BENCH_CASES=big BENCH_MODES=verp
# BENCH_MLMMJ_WINDOW=90, 5 runs after a warm-up, load 21.9 before, 21.8
# .. 29.8 during (others' niced tests and builds); every mlmmj run
# measured to its end inside the window:
#   big verp    pepsi 17.36 (15.18 .. 20.04)  mlmmj 32.14 (29.67 .. 37.61)  ratio 1.88 (1.48 .. 2.48)
# The 3x target is NOT met.  CPU a run: Pepsi's side 21.4 .. 27.6 s
# (PostgreSQL 9.3 .. 12.7, i.e. 0.93 .. 1.27 ms a row; Pepsi 5.5 .. 9.0;
# DNS 1.5 .. 4.8; sinks 2.0 .. 2.7), mlmmj + Postfix 46.4 .. 55.9
# (Postfix and mlmmj 33.5 .. 39.2, DNS 9.6 .. 12.8, sinks 2.8 .. 3.5).
# Against 8da26ca's record above (PostgreSQL 11.0 .. 13.8 a run) the
# server's CPU is somewhat lower, within the spread; the ratio's rise from
# 1.68 is mostly mlmmj's side being slower at this load (32 s against
# 26), not Pepsi faster.
#
# Recorded 2026-12-07 from 17:26, 83aa7a9 (main), small plain at the
# issue's size (1,000 posts of 20 KB to 100 subscribers over 20 domains:
# Pepsi 20,000 rows, one per domain a post; mlmmj 100,000 transactions,
# one per subscriber) with mlmmj measured to its end: BENCH_CASES=small
# BENCH_MODES=plain BENCH_MLMMJ_WINDOW=1500 BENCH_REPEATS=1, one pair an
# invocation (a fresh cluster, Postfix and lists each), one invocation a
# hold of the lock, others' niced builds and tests beside; the first
# with the warm-up pair (not counted; a nice-19 build of another tree ran
# beside it), the others BENCH_WARMUP=0 (a pair with its warm-up holds
# the lock 22 minutes).  Seconds to the last delivery, CPU seconds a run
# by process tree:
#   1 (17:26-17:48, load 11.0 -> 23.8; warm-up pepsi 48.07, mlmmj 584.74):
#     pepsi 36.87  mlmmj 613.15  ratio 16.63
#     CPU pepsi run: PostgreSQL 37.4, Pepsi 16.7, DNS 1.0, sinks 5.2, all 60.3
#     CPU mlmmj run: Postfix and mlmmj 895.4, DNS 117.8, sinks 32.8,
#       PostgreSQL 5.7, Pepsi 1.1, all 1052.8
#   2 (17:58-18:09, load 17.3 -> 32.9):
#     pepsi 39.93  mlmmj 602.20  ratio 15.08
#     CPU pepsi run: PostgreSQL 38.0, Pepsi 15.8, DNS 0.9, sinks 5.8, all 60.5
#     CPU mlmmj run: Postfix and mlmmj 887.2, DNS 116.1, sinks 31.6,
#       PostgreSQL 6.1, Pepsi 1.1, all 1042.1
#   3 (18:20-18:31, load 10.6 -> 29.8):
#     pepsi 43.10  mlmmj 585.76  ratio 13.59
#     CPU pepsi run: PostgreSQL 42.3, Pepsi 17.9, DNS 1.0, sinks 6.9, all 68.1
#     CPU mlmmj run: Postfix and mlmmj 884.2, DNS 119.9, sinks 32.0,
#       PostgreSQL 6.2, Pepsi 1.1, all 1043.3
#   4 (18:39-18:49, load 9.4 -> 18.6):
#     pepsi 39.67  mlmmj 553.10  ratio 13.94
#     CPU pepsi run: PostgreSQL 38.7, Pepsi 16.1, DNS 1.0, sinks 5.9, all 61.7
#     CPU mlmmj run: Postfix and mlmmj 855.2, DNS 110.6, sinks 30.4,
#       PostgreSQL 5.8, Pepsi 1.0, all 1003.0
# Medians of these 4 pairs (min .. max; the mean of the middle two), not
# 5: the lock, shared with others' benchmarks, gave no fifth hold of 11
# minutes before the day's end:
#   small plain pepsi 39.80 (36.87 .. 43.10)  mlmmj 593.98 (553.10 .. 613.15)  ratio 14.51 (13.59 .. 16.63)
# The 3x target is met for small plain (load 9.4 .. 17.3 before a pair,
# 18.6 .. 32.9 after), by about five times over, every mlmmj run
# measured to its end (no lower bound).  mlmmj + Postfix made its 100,000
# transactions at 163 .. 181 a second, using 1,003 .. 1,053 CPU seconds
# a run (10.0 .. 10.5 ms a transaction, 1.7 .. 1.8 of the 2 cores);
# Pepsi its 20,000 rows of 5 recipients with 60 .. 68 CPU seconds (3.0
# .. 3.4 ms a row, 1.5 .. 1.6 of the 2 cores): both CPU-bound, the ratio
# that of the work (Pepsi one transaction per domain, mlmmj's default
# one per subscriber) more than of either side's speed.  The DNS
# server's 111 .. 120 CPU seconds in each mlmmj run are Postfix asking
# the tests' (Python) DNS server for every copy, which a caching
# resolver would mostly save: the set-up costs the peer about a ninth of
# its CPU, so the ratio overstates Pepsi's lead by about that much, far
# from 3x either way.  Warm-up or not: pair 1's warm-up (a cold cluster
# and Postfix) gave pepsi 48.07 s beside a nice-19 build, its run after
# the warm-up 36.87, pairs 2 .. 4 (cold) 39.93, 43.10, 39.67; mlmmj
# 584.74 cold, 613.15 warm, then 602.20, 585.76, 553.10 cold: what a
# cold start costs is within the spread, and it falls on Pepsi's side
# (its figures the higher ones), not in its favour.  PostgreSQL's 5.7 ..
# 6.2 and Pepsi's 1.0 .. 1.1 CPU seconds in each mlmmj run are, most
# likely (not looked into), the cluster's autovacuum and checkpoint
# after Pepsi's 20,000 rows and the idle workers' polling over 10
# minutes.
# Fifth pair, 2026-12-07 18:56-19:06, the same build (83aa7a9) and
# settings (BENCH_WARMUP=0), under the lock, load 4.8 before (others
# done), 20.5 after:
#   5: pepsi 34.86  mlmmj 577.70  ratio 16.57
#     CPU pepsi run: PostgreSQL 37.45, Pepsi 15.88, DNS 0.95, sinks 5.59, all 59.87
#     CPU mlmmj run: Postfix and mlmmj 916.63, DNS 117.39, sinks 33.96,
#       PostgreSQL 6.60, Pepsi 1.10, all 1075.68
# Medians of the 5 pairs (min .. max):
#   small plain pepsi 39.67 (34.86 .. 43.10)  mlmmj 585.76 (553.10 .. 613.15)  ratio 15.08 (13.59 .. 16.63)
# The 3x target is met for small plain at the issue's size, every run
# far above it.
#
# Recorded 2026-12-07 19:24-19:32, 316d5c4's code (the claim's, the
# batch commit's and the batch loads' plans kept generic, destination_end's
# first write by one worker), small verp at the issue's size with mlmmj
# measured to its end (BENCH_CASES=small BENCH_MODES=verp
# BENCH_MLMMJ_WINDOW=1500 BENCH_REPEATS=1 BENCH_WARMUP=0), ONE run a side,
# nothing else running (load 0.2 before, 9.6 after):
#   small verp  pepsi 109.17 s  mlmmj 324.15 s  ratio 2.97
#   CPU pepsi run: PostgreSQL 104.88, Pepsi 52.08, DNS 1.05, sinks 22.65, all 180.66
#   CPU mlmmj run: Postfix and mlmmj 462.87, DNS 105.08, sinks 29.33,
#     PostgreSQL 4.97, Pepsi 0.81, all 603.06
# Against 5e56b28's single run above (pepsi 148.33 s, mlmmj 386.41, 2.61):
# PostgreSQL's CPU for the 100,000 rows 104.9 s against 150.6 (1.05 ms a
# row against 1.51), Pepsi's processes 52.1 against 62.4, Pepsi's time
# 26% less; mlmmj's side was faster too (quieter: 603 CPU seconds against
# 712).  The 3x target is NOT met (2.97, one run a side, not a median of
# five).
#
# The relay stage's QUEUE_LIMIT, 2026-12-07 from 20:30: the bench had set
# QUEUE_LIMIT = 4 for its 30 relay workers since it was written (no reason
# recorded), where the stage's default, which a postmaster gets, is 16.
# With 4, a claim's rows came back to the workers a few at a time (the
# slots one answer freed), so a worker's batch was 2 to 3 rows, each
# batch on another domain: per-worker domain runs (from the maillog, rows
# in the order each worker sent them), 2,000 subscribers over 100 domains,
# verp, Pepsi alone, 3 runs a setting after a warm-up, f007521's code,
# under the lock, load 5 .. 14:
#   QUEUE_LIMIT  4: pepsi 2.96 s, then 2.35 s (two sets); 2,514 domain runs per 8,000 rows (3.2 rows a run)
#   QUEUE_LIMIT 16: pepsi 2.34 s, then 1.87 s;            1,150 domain runs per 8,000 rows (7.0 rows a run)
#   CPU a run (all processes): 4: 2.9 .. 4.4 s; 16: 2.2 .. 3.9 s
# At the issue's size, big verp, Pepsi alone, 3 runs after a warm-up,
# QUEUE_LIMIT 16 then 4 (load 9.3 -> 15.7, then 21.9 -> 24.7):
#   16: pepsi 8.25 s (8.13 .. 8.68)   CPU a run 12.1 .. 13.0 s (PostgreSQL 4.3 .. 4.4, Pepsi 4.4 .. 4.8)
#    4: pepsi 12.91 s (11.17 .. 15.56) CPU a run 17.3 .. 24.5 s (PostgreSQL 8.2 .. 9.7, Pepsi 5.7 .. 8.2)
# Fewer, larger batches: one load, one destination_begin and one commit
# serve a run of a domain's rows, and each worker sees fewer domains (its
# own MX and MTA-STS lookups).  From cedc96d on the bench leaves the
# stage's QUEUE_LIMIT at its default (BENCH_RELAY_QUEUE_LIMIT sets it).
#
# Recorded 2026-12-07 20:40-20:44, cedc96d (f007521's code, the relay at
# its default QUEUE_LIMIT), big verp at the issue's size
# (BENCH_CASES=big BENCH_MODES=verp BENCH_MLMMJ_WINDOW=90, 5 runs after a
# warm-up), under the lock, load 16.3 before, 13.0 .. 17.7 during
# (others' niced builds and tests); every mlmmj run measured to its end:
#   big verp    pepsi 7.66 (7.46 .. 8.65)  mlmmj 26.88 (24.46 .. 28.35)  ratio 3.28 (3.15 .. 3.51)
# The 3x target is met: the median and every run above it.  CPU a run:
# Pepsi's side 11.3 .. 12.9 s (PostgreSQL 4.0 .. 4.7, Pepsi 4.1 .. 4.8,
# DNS 0.9 .. 1.3, sinks 1.9 .. 2.3); mlmmj + Postfix 43.1 .. 51.4
# (Postfix and mlmmj 31.3 .. 36.8, DNS 8.5 .. 10.6, sinks 2.9 .. 3.5).
# The caveat of the records above holds: Postfix asks the tests' DNS
# server for every copy, which a caching resolver would mostly save.
# Without the DNS server's CPU on either side, mlmmj + Postfix used 34.6
# .. 40.8 CPU seconds a run against Pepsi's 10.0 .. 11.8: 3.3 .. 3.6
# times, run by run; each side kept most of the 2 cores busy (Pepsi 1.5
# cores on average over its runs, mlmmj + Postfix 1.8), so the ratio of
# the work stands without that cost.
#
# Recorded 2026-12-07 20:44-21:24, cedc96d (f007521's code, the relay at
# its default QUEUE_LIMIT), small verp at the issue's size (1,000 posts of
# 20 KB to 100 subscribers over 20 domains: 100,000 rows a side) with
# mlmmj measured to its end: BENCH_CASES=small BENCH_MODES=verp
# BENCH_MLMMJ_WINDOW=1500 BENCH_REPEATS=1 BENCH_WARMUP=0, one pair an
# invocation and a hold of the lock, five in a row, others' niced builds
# and tests beside:
#   1 (20:44-20:52, load 8.7 -> 10.6):  pepsi 72.81  mlmmj 367.25  ratio 5.04
#   2 (20:53-21:00, load 3.2 -> 12.0):  pepsi 74.72  mlmmj 337.96  ratio 4.52
#   3 (21:00-21:08, load 7.5 -> 10.8):  pepsi 75.17  mlmmj 360.15  ratio 4.79
#   4 (21:09-21:16, load 6.5 -> 10.2):  pepsi 87.03  mlmmj 338.77  ratio 3.89
#   5 (21:17-21:24, load 5.5 -> 11.2):  pepsi 69.50  mlmmj 400.22  ratio 5.76
# Medians of the 5 pairs (min .. max):
#   small verp  pepsi 74.72 (69.50 .. 87.03)  mlmmj 360.15 (337.96 .. 400.22)  ratio 4.79 (3.89 .. 5.76)
# The 3x target is met, every pair above it.  CPU a run: Pepsi's side
# 116.2 .. 146.6 s (PostgreSQL 60.0 .. 74.9, 0.60 .. 0.75 ms a row, against
# 1.05 at QUEUE_LIMIT 4; Pepsi 36.1 .. 45.1; DNS 0.9 .. 1.1; sinks 19.3 ..
# 25.6); mlmmj + Postfix 590.7 .. 668.5 (Postfix and mlmmj 452.9 .. 510.0,
# DNS 105.1 .. 119.7, sinks 26.9 .. 32.4).  Without the DNS server's CPU
# (the caveat above), mlmmj + Postfix used 485.6 .. 548.8 CPU seconds a
# run against Pepsi's 115.3 .. 145.6: 3.6 .. 4.5 times, run by run.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"

repeats=${BENCH_REPEATS:-5}
subscribers=${BENCH_SUBSCRIBERS:-10000}
domains=${BENCH_DOMAINS:-500}
posts=${BENCH_POSTS:-1000}
small=${BENCH_SMALL:-100}
small_domains=${BENCH_SMALL_DOMAINS:-20}
post_size=${BENCH_POST_SIZE:-20480}
cases=${BENCH_CASES:-big small}
modes=${BENCH_MODES:-verp plain}
workers=${BENCH_RELAY_WORKERS:-30}
# The relay workers' pipelines: the stage's default QUEUE_LIMIT (16), as a
# postmaster would run it, unless BENCH_RELAY_QUEUE_LIMIT says otherwise
# (until 2026-12-07 20:40 the bench set 4; see the record of that day).
relay_queue_limit=${BENCH_RELAY_QUEUE_LIMIT:+QUEUE_LIMIT = $BENCH_RELAY_QUEUE_LIMIT}
dns_address=127.0.0.199
mx_hosts=20
log=$(bench_log list)

[ "$(id -u)" = 0 ] || { echo "bench/list runs as root (ports 25 and 53)" >&2; exit 1; }
command -v mlmmj-receive >/dev/null || { echo "bench/list needs mlmmj (apt-get install mlmmj)" >&2; exit 1; }
bench_postfix_install
bench_require_programs pepsi-ingress pepsi-dispatch pepsi-stage-list pepsi-stage-relay-to-internet
postfix_dir=

cleanup() {
    if [ -n "${BENCH_SAVE:-}" ] && [ -n "$BENCH_DIR" ]; then
        mkdir -p "$BENCH_SAVE"
        cp "$BENCH_DIR"/*.log "$BENCH_SAVE"/ 2>/dev/null || true
        bench_psql -c "\\copy (SELECT * FROM pepsi.mail_log ORDER BY 1) TO '$BENCH_DIR/mail_log.csv' CSV HEADER" >/dev/null 2>&1 &&
            cp "$BENCH_DIR/mail_log.csv" "$BENCH_SAVE"/ || true
        [ -z "$postfix_dir" ] || cp "$postfix_dir/maillog" "$BENCH_SAVE"/postfix-maillog 2>/dev/null || true
    fi
    if [ -n "$postfix_dir" ]; then
        bench_postfix_stop "$postfix_dir"
    fi
    bench_cleanup
}
if [ "${BENCH_STATEMENTS:-0}" = 1 ]; then
    bench_cluster_start "max_connections = 200" "shared_preload_libraries = 'pg_stat_statements'" \
        "pg_stat_statements.track = all" "pg_stat_statements.track_planning = on"
    bench_psql -c "CREATE EXTENSION pg_stat_statements" >/dev/null
else
    bench_cluster_start "max_connections = 200"
fi
trap cleanup EXIT

# The subscribers, in the order mlmmj reads them (one file): u<k>@d<j>,
# each domain's together.  subs N D: N addresses over D domains.
subs() {
    awk -v n="$1" -v d="$2" -v tag="$3" 'BEGIN {
        for (j = 0; j < d; j++)
            for (k = j; k < n; k += d) printf "u%d%s@d%d.bench.test\n", k, tag, j }'
}
# transactions FILE SIDE MODE: the SMTP transactions the MX hosts see
# for one post: one per subscriber with VERP, and one per subscriber from
# mlmmj in either mode (its default gives every subscriber a copy on a
# return path of its own, list+bounces-N-user=domain, Postfix's maillog
# shows nrcpt=1 for each); Pepsi plain one per domain.  (Until
# 2026-12-07 mlmmj plain was counted as batches of 100 recipients split
# by domain: its measure stopped at the 500th of 10,000 transactions.)
transactions() {
    local file=$1 side=$2 mode=$3
    if [ "$mode" = verp ] || [ "$side" = mlmmj ]; then
        wc -l <"$file"
    else
        sed 's/.*@//' "$file" | sort -u | wc -l
    fi
}

zone="$BENCH_DIR/internet.zone"
{
    echo "bench.test. 3600 IN SOA ns.bench.test. hostmaster.bench.test. 1 3600 600 86400 3600"
    for ((h = 0; h < mx_hosts; h++)); do
        echo "mx$h.bench.test. 3600 IN A 127.0.0.$((140 + h))"
    done
    max_domains=$((domains > small_domains ? domains : small_domains))
    for ((i = 0; i < max_domains; i++)); do
        echo "d$i.bench.test. 3600 IN MX 10 mx$((i % mx_hosts)).bench.test."
    done
} >"$zone"
bench_dns_start "$dns_address" 53 "$zone"
sinks=()
for ((h = 0; h < mx_hosts; h++)); do
    bench_sink_start_at "127.0.0.$((140 + h))" 25 "$BENCH_DIR/sink$h.out"
    sinks+=("$BENCH_DIR/sink$h.out")
done
delivered() { bench_sinks_count "${sinks[@]}"; }

subs "$subscribers" "$domains" "" >"$BENCH_DIR/big.subs"
subs "$small" "$small_domains" s >"$BENCH_DIR/small.subs"

# Pepsi: four lists (big, bigv, small, smallv), open to anyone's posts.
pepsi_port=$(bench_free_port)
postfix_port=$(bench_free_port)
give_to_user "$BENCH_DIR/big.subs" "$BENCH_DIR/small.subs"
for l in big small; do
    for v in "" v; do
        bench_psql -c "SELECT pepsi.list_configure(id, 'posting_policy', 'open'),
                pepsi.list_configure(id, 'verp', '$([ "$v" = v ] && echo true || echo false)'),
                pepsi.list_configure(id, 'dmarc_mitigation', 'none')
            FROM (SELECT pepsi.list_create('$l$v@lists.bench.test', 'owner@poster.bench.test', '$l') AS id) c" >/dev/null
        bench_psql -c "CREATE TEMP TABLE s (a text)" -c "\\copy s FROM '$BENCH_DIR/$l.subs'" \
            -c "SELECT count(pepsi.list_member_add(m.id, s.a)) FROM s,
                    pepsi.mailing_list m WHERE m.address = '$l$v@lists.bench.test'" >/dev/null
    done
done
bench_pepsi_start "$pepsi_port" "[stage-init]
PROGRAM = pepsi-stage-list
NEXT_STAGE = internet
REPLY_STAGE = internet
PARALLELISM = 2
[stage-internet]
PROGRAM = pepsi-stage-relay-to-internet
PARALLELISM = $workers
$relay_queue_limit
SESSION_CACHE = 20
RETRY_BASE = 10s" "" "LOCAL_DOMAINS = lists.bench.test
LOCAL_RECIPIENTS = virtual
DNS_FORWARDER = $dns_address@53"

# mlmmj: the same four lists, spooled under the unprivileged user.
ml_dir="$BENCH_DIR/mlmmj"
for l in big small; do
    for v in "" v; do
        d="$ml_dir/$l$v"
        for sub in incoming queue queue/discarded archive text subconf unsubconf bounce control \
            moderation subscribers.d digesters.d requeue nomailsubs.d; do
            mkdir -p "$d/$sub"
        done
        echo "$l$v@lists.bench.test" >"$d/control/listaddress"
        echo "owner@poster.bench.test" >"$d/control/owner"
        echo 127.0.0.1 >"$d/control/relayhost"
        echo "$postfix_port" >"$d/control/smtpport"
        # VERP done by Postfix (XVERP), as mlmmj documents for it (TUNABLES,
        # VERP_README): any other text is appended to MAIL FROM as is, and
        # Postfix refuses an unknown parameter.
        [ "$v" != v ] || echo postfix >"$d/control/verp"
        cp "$BENCH_DIR/$l.subs" "$d/subscribers.d/u"
    done
done
give_to_user "$ml_dir"

# Stock Postfix, the lists' addresses piped to mlmmj-receive, delivering
# by MX; its smtp client chrooted so that it reads the queue directory's
# etc/resolv.conf.
postfix_dir=$(mktemp -d /tmp/pepsi-bench-postfix.XXXXXX)
mkdir -p "$postfix_dir/etc"
for l in big bigv small smallv; do
    echo "$l@lists.bench.test mlmmj:$l"
done >"$postfix_dir/etc/transport"
bench_postfix_start "$postfix_dir" "$postfix_port" "relay_domains = lists.bench.test" \
    "transport_maps = hash:$postfix_dir/etc/transport" "recipient_delimiter = +" \
    "mlmmj_destination_recipient_limit = 1" \
    "smtpd_authorized_verp_clients = 127.0.0.0/8"
postmap -c "$postfix_dir/etc" "$postfix_dir/etc/transport"
cat >>"$postfix_dir/etc/master.cf" <<CF
mlmmj unix - n n - - pipe
  flags=ORhu user=$PEPSI_USER argv=/usr/bin/mlmmj-receive -F -L $ml_dir/\${nexthop}/
CF
mkdir -p "$postfix_dir/spool/etc"
echo "nameserver $dns_address" >"$postfix_dir/spool/etc/resolv.conf"
printf 'hosts: files dns\n' >"$postfix_dir/spool/etc/nsswitch.conf"
: >"$postfix_dir/spool/etc/hosts"
cp /etc/services "$postfix_dir/spool/etc/services"
postconf -c "$postfix_dir/etc" -F smtp/unix/chroot=y
/usr/sbin/postfix -c "$postfix_dir/etc" reload >/dev/null 2>&1

# CPU seconds (user + system, with reaped children's) of the process
# trees, so that a run says whether its wall time followed the CPU it got:
# cpu_trees NAME=PID,PID... prints NAME=SECONDS for each, the processes
# under those PIDs that are alive now (a child that exited is in its
# parent's cutime, so the sum over a run is right however short-lived).
cpu_trees() {
    cat /proc/[0-9]*/stat 2>/dev/null | awk -v trees="$*" '
        { pid = $1; rest = $0; sub(/^.*\) /, "", rest); split(rest, f, " ")
          parent[pid] = f[2]; ticks[pid] = f[12] + f[13] + f[14] + f[15] }
        END { n = split(trees, t, " ")
              for (i = 1; i <= n; i++) {
                  split(t[i], nv, "="); m = split(nv[2], roots, ",")
                  delete isroot; for (j = 1; j <= m; j++) if (roots[j] != "") isroot[roots[j]] = 1
                  sum = 0
                  for (p in ticks) {
                      q = p; hops = 0
                      while (q != "" && q > 1 && !(q in isroot) && hops++ < 64) q = parent[q]
                      if (q in isroot) sum += ticks[p]
                  }
                  printf "%s%s=%.2f", (i > 1 ? " " : ""), nv[1], sum / 100 }
              print "" }'
}
cpu_now() {
    local sinks
    sinks=$(printf '%s,' "${BENCH_SINK_PIDS[@]}")
    cpu_trees "postgres=$(head -1 "$BENCH_DIR/data/postmaster.pid")" \
        "pepsi=${BENCH_DISPATCH_PID:-},${BENCH_INGRESS_PID:-}" \
        "postfix+mlmmj=$(cat "$postfix_dir/spool/pid/master.pid" 2>/dev/null | tr -d ' ')" \
        "dns=$BENCH_DNS_PID" "sinks=$sinks"
}
# cpu_delta BEFORE AFTER: the seconds each tree used in between.
cpu_delta() {
    awk -v a="$1" -v b="$2" 'BEGIN { n = split(a, x, " "); split(b, y, " "); total = 0
        for (i = 1; i <= n; i++) { split(x[i], u, "="); split(y[i], v, "=")
            printf "%s %.2f, ", u[1], v[2] - u[2]; total += v[2] - u[2] }
        printf "all %.2f\n", total }'
}

# measure SIDE CASE MODE: prints the seconds from the first post sent to
# the last transaction received; the CPU the process trees used meanwhile
# goes to $BENCH_DIR/cpu.SIDE.
measure() {
    local side=$1 case=$2 mode=$3 list port count want base start end cpu_before window
    list=$case$([ "$mode" = verp ] && echo v || true)@lists.bench.test
    port=$([ "$side" = pepsi ] && echo "$pepsi_port" || echo "$postfix_port")
    count=$([ "$case" = big ] && echo 1 || echo "$posts")
    want=$(($(transactions "$BENCH_DIR/$case.subs" "$side" "$mode") * count))
    window=$([ "$side" = mlmmj ] && echo "${BENCH_MLMMJ_WINDOW:-}" || true)
    base=$(delivered)
    cpu_before=$(cpu_now)
    start=$(date +%s.%N)
    if [ -n "$window" ]; then
        bounded "$port" "$count" "$list" "$base" "$want" "$start" "$window"
        return
    fi
    python3 "$here/post.py" "$port" "$count" "$list" "$post_size" >>"$log" 2>&1 || {
        echo "$side: posting to $list failed (see $log)" >&2
        return 1
    }
    # 20 minutes at most.
    for _ in $(seq 1 24000); do
        [ "$(delivered)" -ge $((base + want)) ] && break
        sleep 0.05
    done
    end=$(date +%s.%N)
    echo $((base + want)) >"$BENCH_DIR/expected"
    cpu_delta "$cpu_before" "$(cpu_now)" >"$BENCH_DIR/cpu.$side"
    if [ "$(delivered)" -lt $((base + want)) ]; then
        echo "$side $case $mode: only $(($(delivered) - base)) of $want transactions arrived" >&2
        return 1
    fi
    awk -v a="$start" -v e="$end" 'BEGIN { printf "%.2f\n", e - a }'
}
# bounded PORT COUNT LIST BASE WANT START WINDOW (BENCH_MLMMJ_WINDOW):
# mlmmj + Postfix for WINDOW seconds at most.  Posts in the background,
# samples the sinks' count every second, and if the WANT transactions
# are not all in by then, stops mlmmj and empties both queues (stop_mlmmj)
# and prints a LOWER BOUND on the time to the last delivery, prefixed
# ">=": the seconds elapsed plus the transactions left at the fastest
# rate seen in any BOUND_SPAN (5) second span of the window.  The count
# done, the seconds, that peak rate go to $BENCH_DIR/bound (for the
# report).  The rate after the window is assumed no faster than the
# fastest seen in it: mlmmj-send is one connection, one transaction at a
# time, whose rate does not grow with the list.
bounded() {
    local port=$1 count=$2 list=$3 base=$4 want=$5 start=$6 window=$7 post_pid now i n
    local -a at=() done=()
    python3 "$here/post.py" "$port" "$count" "$list" "$post_size" >>"$log" 2>&1 &
    post_pid=$!
    for ((i = 0; i <= 2 * window; i++)); do
        n=$(($(delivered) - base))
        now=$(date +%s.%N)
        at+=("$now") done+=("$n")
        [ "$n" -ge "$want" ] && break
        awk -v a="$start" -v e="$now" -v w="$window" 'BEGIN { exit !(e - a >= w) }' && break
        sleep 1
    done
    echo $((base + want)) >"$BENCH_DIR/expected"
    if [ "$n" -ge "$want" ]; then
        wait "$post_pid" || true
        cpu_delta "$cpu_before" "$(cpu_now)" >"$BENCH_DIR/cpu.mlmmj"
        : >"$BENCH_DIR/bound"
        awk -v a="$start" -v e="${at[-1]}" 'BEGIN { printf "%.2f\n", e - a }'
        return
    fi
    kill "$post_pid" 2>/dev/null || true
    wait "$post_pid" 2>/dev/null || true
    cpu_delta "$cpu_before" "$(cpu_now)" >"$BENCH_DIR/cpu.mlmmj"
    stop_mlmmj
    printf '%s\n' "${at[@]}" | paste - <(printf '%s\n' "${done[@]}") | awk -v s="$start" -v want="$want" \
        -v span="${BOUND_SPAN:-5}" -v out="$BENCH_DIR/bound" '
        { t[NR] = $1; d[NR] = $2 }
        END { peak = 0
              for (i = 1; i <= NR; i++)
                  for (j = i + 1; j <= NR; j++)
                      if (t[j] - t[i] >= span) { r = (d[j] - d[i]) / (t[j] - t[i]); if (r > peak) peak = r; break }
              el = t[NR] - s
              if (peak <= 0) { printf "no transaction in the window\n" > "/dev/stderr"; exit 1 }
              printf "%d %.2f %.2f\n", d[NR], el, peak > out
              printf ">=%.2f\n", el + (want - d[NR]) / peak }'
}
# stop_mlmmj: end a bounded run: TERM every mlmmj process under this
# Postfix (mlmmj-send then requeues the rest in its list's requeue/),
# delete everything in Postfix's queue (postsuper -d ALL, again while a
# pipe delivery that was killed defers its post), and empty the lists'
# queue/ and requeue/; 30 seconds at most.
stop_mlmmj() {
    local master pids
    master=$(tr -d ' ' <"$postfix_dir/spool/pid/master.pid")
    for _ in $(seq 1 30); do
        pids=$(ps -eo pid=,ppid=,comm= | awk -v m="$master" '
            { parent[$1] = $2; name[$1] = $3 }
            END { for (p in name) if (name[p] ~ /^mlmmj-/) {
                      q = p; hops = 0
                      while (q in parent && q != m && hops++ < 16) q = parent[q]
                      if (q == m) print p } }')
        # shellcheck disable=SC2086 # one PID a word
        [ -z "$pids" ] || kill $pids 2>/dev/null || true
        /usr/sbin/postsuper -c "$postfix_dir/etc" -d ALL >/dev/null 2>&1 || true
        if [ -z "$pids" ] && [ -z "$(find "$postfix_dir/spool/incoming" "$postfix_dir/spool/active" \
            "$postfix_dir/spool/deferred" "$postfix_dir/spool/maildrop" -type f 2>/dev/null | head -1)" ]; then
            break
        fi
        sleep 1
    done
    find "$ml_dir"/*/queue "$ml_dir"/*/requeue -mindepth 1 -maxdepth 1 ! -name discarded \
        -exec rm -rf {} + 2>/dev/null || true
}
pepsi_reset() { bench_queue_empty pepsi.destination; }
# settle: wait (two minutes at most) until neither side has anything left
# to do, Pepsi's queue, Postfix's and mlmmj's empty and the sinks' count
# still for a second, so that no transaction or CPU of one run falls in
# the next (the count a run waits for is reached by the transactions of
# any side: before 2026-12-07 a side's leftovers ended the other's
# measure early).  Says so if the sinks took more transactions than the
# runs counted.
settle() {
    local last now expected
    for _ in $(seq 1 120); do
        last=$(delivered)
        sleep 1
        now=$(delivered)
        [ "$now" = "$last" ] || continue
        [ "$(bench_queue_rows)" = 0 ] || continue
        [ -z "$(find "$postfix_dir/spool/incoming" "$postfix_dir/spool/active" "$postfix_dir/spool/deferred" \
            "$postfix_dir/spool/maildrop" "$ml_dir"/*/queue -maxdepth 1 -type f 2>/dev/null | head -1)" ] || continue
        expected=$(cat "$BENCH_DIR/expected" 2>/dev/null || echo "$now")
        [ "$now" -le "$expected" ] ||
            echo "bench/list: the sinks took $((now - expected)) transactions more than the runs counted" >&2
        echo "$now" >"$BENCH_DIR/expected"
        return 0
    done
    echo "bench/list: the queues did not empty within two minutes (the next run is not alone)" >&2
}
# bound_note FIGURE: for a lower bound (">=S"), what it rests on.
bound_note() {
    local done el peak
    [[ $1 == ">="* ]] || return 0
    read -r done el peak <"$BENCH_DIR/bound"
    printf ' (LOWER BOUND, not measured: %s transactions in the %s s window, the rest at its peak %s/s)' \
        "$done" "$el" "$peak"
}
# perf_start TAG / perf_stop: BENCH_PERF's recording of PostgreSQL's
# and Pepsi's process trees during one Pepsi run.
perf_pid=
perf_start() {
    [ -n "${BENCH_PERF:-}" ] || return 0
    local pids
    mkdir -p "$BENCH_PERF"
    pids=$({ cat /proc/[0-9]*/stat 2>/dev/null || true; } | awk -v roots="$(head -1 "$BENCH_DIR/data/postmaster.pid") ${BENCH_DISPATCH_PID:-}" '
        { pid = $1; rest = $0; sub(/^.*\) /, "", rest); split(rest, f, " "); parent[pid] = f[2] }
        END { n = split(roots, r, " "); for (i = 1; i <= n; i++) isroot[r[i]] = 1
              for (p in parent) { q = p; hops = 0
                  while (q > 1 && !(q in isroot) && hops++ < 64) q = parent[q]
                  if (q in isroot) out = out (out == "" ? "" : ",") p }
              print out }')
    perf record ${BENCH_PERF_OPTS:-} -F 999 -o "$BENCH_PERF/perf.$1" -p "$pids" >"$BENCH_PERF/perf.$1.log" 2>&1 &
    perf_pid=$!
    sleep 0.5
}
perf_stop() {
    [ -n "$perf_pid" ] || return 0
    kill -INT "$perf_pid" 2>/dev/null || true
    wait "$perf_pid" 2>/dev/null || true
    perf_pid=
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
load() { cut -d' ' -f1 /proc/loadavg; }

echo "bench/list: big = 1 post of $post_size bytes to $subscribers subscribers over $domains domains;" \
    "small = $posts posts to $small subscribers over $small_domains domains; 20 MX hosts;" \
    "modes: $modes; $repeats runs a side alternating; Pepsi as $BENCH_PEPSI_FLAVOUR, $workers relay workers"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
bench_started=$(date +%s)
for c in $cases; do
    for m in $modes; do
        if [ "${BENCH_WARMUP:-1}" = 1 ]; then
            settle
            pepsi_reset
            wp=$(measure pepsi "$c" "$m")
            sync
            settle
            wm=$([ "${BENCH_PEPSI_ONLY:-0}" = 1 ] && echo skipped || measure mlmmj "$c" "$m")
            echo "warm-up $c $m (not counted): pepsi $wp s, mlmmj+postfix $wm s$(bound_note "$wm")"
        fi
        declare -a tp=() tm=() rr=()
        bounds=0
        for ((r = 1; r <= repeats; r++)); do
            settle
            pepsi_reset
            [ "${BENCH_STATEMENTS:-0}" != 1 ] || bench_psql -c "SELECT pg_stat_statements_reset()" >/dev/null
            perf_start "$c.$m.$r"
            p=$(measure pepsi "$c" "$m")
            perf_stop
            [ "${BENCH_STATEMENTS:-0}" != 1 ] || bench_psql -c "SELECT calls, plans, round(total_plan_time::numeric) AS plan_ms, round(total_exec_time::numeric) AS ms,
                    round(mean_exec_time::numeric, 3) AS mean, rows, shared_blks_dirtied AS dirtied,
                    wal_records AS wal, toplevel, left(regexp_replace(query, '\s+', ' ', 'g'), 110) AS statement
                FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 30" >>"$BENCH_DIR/statements.$c.$m.$r.log"
            sync
            if [ "${BENCH_PEPSI_ONLY:-0}" = 1 ]; then
                printf 'run %d %s %s: pepsi %s s (load %s)\n  cpu s, pepsi run: %s\n' "$r" "$c" "$m" "$p" \
                    "$(load)" "$(cat "$BENCH_DIR/cpu.pepsi")"
                tp+=("$p")
                continue
            fi
            settle
            q=$(measure mlmmj "$c" "$m")
            [[ $q != ">="* ]] || bounds=$((bounds + 1))
            tp+=("$p") tm+=("${q#>=}") rr+=("$(ratio "${q#>=}" "$p")")
            printf 'run %d %s %s: pepsi %s s, mlmmj+postfix %s s%s, ratio %s%s (load %s)\n' \
                "$r" "$c" "$m" "$p" "$q" "$(bound_note "$q")" "${q%%[0-9]*}" "${rr[-1]}" "$(load)"
            printf '  cpu s, pepsi run: %s\n  cpu s, mlmmj run: %s\n' "$(cat "$BENCH_DIR/cpu.pepsi")" \
                "$(cat "$BENCH_DIR/cpu.mlmmj")"
        done
        if [ "${BENCH_PEPSI_ONLY:-0}" = 1 ]; then
            printf '%s %s: pepsi median %s s (runs %s .. %s), Pepsi alone\n' "$c" "$m" \
                "$(bench_median "${tp[@]}")" "$(min "${tp[@]}")" "$(max "${tp[@]}")"
            continue
        fi
        printf '%s %s: pepsi median %s s (runs %s .. %s), mlmmj+postfix median %s s (runs %s .. %s),' \
            "$c" "$m" "$(bench_median "${tp[@]}")" "$(min "${tp[@]}")" "$(max "${tp[@]}")" \
            "$(bench_median "${tm[@]}")" "$(min "${tm[@]}")" "$(max "${tm[@]}")"
        printf ' ratio median %s (runs %s .. %s; target >= 3.00)\n' \
            "$(bench_median "${rr[@]}")" "$(min "${rr[@]}")" "$(max "${rr[@]}")"
        [ "$bounds" = 0 ] ||
            echo "  ($c $m: $bounds of $repeats mlmmj+postfix figures, and the ratios from them, are LOWER BOUNDS, not measured times)"
    done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "the benchmark took $(($(date +%s) - bench_started)) s"
