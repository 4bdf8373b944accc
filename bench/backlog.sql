-- bench/backlog.sql: rows :first to :last of a queue in the shape of a
-- backlog (bench/admin and bench/metrics load it; psql -v first=1 -v last=N):
-- most rows deferred (paused) at the relay stage, the rest pending,
-- running, failed, timed out or held across the other stages; one to five
-- recipients each, spread unevenly over 1,000 domains; received over the
-- last two days; about 600 bytes of headers per row, as ingress writes them.
-- A thousand bodies, shared as splits and clones share them.
INSERT INTO pepsi.workqueue_body (id, body) OVERRIDING SYSTEM VALUE
SELECT n, convert_to(repeat(md5(n::text), 64), 'UTF8') FROM generate_series(1, 1000) AS n
ON CONFLICT (id) DO NOTHING;

CREATE TEMP TABLE shape AS
SELECT n,
       random() AS r_status,
       random() AS r_stage,
       -- skewed, as real destinations are: a few big providers, a long tail
       (floor(power(random(), 3) * 1000))::int AS domain_no,
       CASE WHEN n % 20 = 0 THEN 5 WHEN n % 10 = 0 THEN 2 ELSE 1 END AS recipients
FROM generate_series(:first, :last) AS n;

INSERT INTO pepsi.workqueue (stage, status, timeout, received_at, mail_from, rcpt_to,
                             headers, body_id, client_address, auth_account)
SELECT CASE WHEN r_status < 0.60 THEN 'relay'
            WHEN r_stage < 0.10 THEN 'init' WHEN r_stage < 0.40 THEN 'route'
            WHEN r_stage < 0.60 THEN 'dkim-sign' WHEN r_stage < 0.90 THEN 'relay'
            ELSE 'bounce' END,
       status::pepsi.status,
       CASE status WHEN 'paused' THEN CASE WHEN r_stage < 0.02 THEN 'infinity'
                                           ELSE now() + random() * interval '1 hour' END END,
       now() - random() * interval '2 days',
       'sender' || (n % 5000) || '@example.org',
       (SELECT array_agg('user' || ((n + k) % 997) || '@d' || ((domain_no + k * 37) % 1000) || '.example')
        FROM generate_series(0, recipients - 1) AS k),
       convert_to(
           'Received: from mx' || (n % 97) || '.example.org (mx.example.org [192.0.2.' || (n % 250) || '])' || E'\r\n'
           || E'\tby pepsi.example.net with ESMTPS id ' || md5(n::text) || E';\r\n'
           || E'\tMon, 30 Nov 2026 09:00:00 +0000\r\n'
           || 'Authentication-Results: pepsi.example.net; spf=pass smtp.mailfrom=example.org;' || E'\r\n'
           || E'\tdkim=pass header.d=example.org\r\n'
           || 'DKIM-Signature: v=1; a=rsa-sha256; d=example.org; s=s1; h=from:to:subject:date;' || E'\r\n'
           || E'\tb=' || repeat(md5((n * 7)::text), 5) || E'\r\n'
           || 'From: Sender <sender' || (n % 5000) || E'@example.org>\r\n'
           || 'To: <user' || (n % 997) || '@d' || domain_no || E'.example>\r\n'
           || 'Subject: Benchmark message ' || n || E'\r\n'
           || 'Message-ID: <' || md5(n::text) || E'@example.org>\r\n', 'UTF8'),
       1 + n % 1000,
       CASE WHEN n % 10 <> 0 THEN '10.0.0.0'::inet + (n % 10000) END,
       CASE WHEN n % 10 = 0 THEN 'account' || (n % 300) END
FROM (SELECT *, CASE WHEN r_status < 0.60 THEN 'paused'
                     WHEN r_status < 0.90 THEN 'pending'
                     WHEN r_status < 0.93 THEN 'running'
                     WHEN r_status < 0.99 THEN 'failed'
                     ELSE 'timeout' END AS status
      FROM shape) AS s;
DROP TABLE shape;
VACUUM ANALYZE pepsi.workqueue;
