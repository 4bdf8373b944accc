-- (a) admission as bare SQL: the body row and the queue row in one
-- statement, the same writes workqueue_add makes.
WITH b AS (INSERT INTO pepsi.workqueue_body (body) VALUES (:body) RETURNING id)
INSERT INTO pepsi.workqueue (stage, state, mail_from, rcpt_to, headers, body_id, client_address, auth_account)
SELECT 'init', '{}', :mail_from::text, :rcpt_to::text[], :headers::bytea, b.id, NULL, NULL FROM b
RETURNING id;
