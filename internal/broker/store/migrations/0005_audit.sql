-- What administrators did through the admin API: who (which admin
-- token), what (method and path), when, from where, and the answer.
CREATE TABLE audit (
    id      TEXT PRIMARY KEY,
    at      BIGINT NOT NULL,
    actor   TEXT NOT NULL,
    action  TEXT NOT NULL,
    source  TEXT NOT NULL,
    status  INTEGER NOT NULL
);
CREATE INDEX audit_at ON audit (at);
