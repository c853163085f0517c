-- The dashboard's sign-outs: the sessions ended before they expired.
--
-- A dashboard session is a signed cookie (d1queue/dashboard/session.py);
-- signing out clears it in that browser, and writes its nonce here, so a
-- copy of the cookie replayed afterwards is refused. A request carrying a
-- session reads this table once, by primary key (the nonce).
--
-- Only a valid session (its MAC under the API token's key, unexpired, and
-- not already here) can sign out, and the row lives no longer than the
-- session would have: expires_at is the session's own end. Each sign-out
-- deletes a bounded number of expired rows in the same batch (through the
-- index on expires_at), so the table holds about the sign-outs of the last
-- session lifetime. WITHOUT ROWID: the row is its key, a point read is one
-- seek.
CREATE TABLE d1queue_signouts (
    nonce      TEXT    PRIMARY KEY NOT NULL,  -- the session's nonce
    expires_at INTEGER NOT NULL               -- epoch ms: the session's end
) WITHOUT ROWID;

CREATE INDEX d1queue_signouts_expiry ON d1queue_signouts (expires_at);
