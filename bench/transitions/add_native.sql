-- (a) admission of one message through the native function.
SELECT pepsi.workqueue_add(:mail_from, :rcpt_to, :headers, :body);
