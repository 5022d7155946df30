-- Session control commands (logoff, disconnect, message) an administrator
-- queued for a host's agent (the audit table says who), which takes them
-- with its next heartbeat and answers each. Times are Unix milliseconds.
CREATE TABLE host_commands (
    id          TEXT PRIMARY KEY,
    host_name   TEXT NOT NULL,
    session_id  TEXT NOT NULL,
    user_name   TEXT NOT NULL,
    kind        TEXT NOT NULL,
    text        TEXT NOT NULL DEFAULT '',
    state       TEXT NOT NULL,
    error       TEXT NOT NULL DEFAULT '',
    created_at  BIGINT NOT NULL,
    sent_at     BIGINT,
    done_at     BIGINT
);
CREATE INDEX host_commands_pending ON host_commands (host_name) WHERE state = 'pending';
