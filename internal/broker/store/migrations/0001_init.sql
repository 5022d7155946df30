-- Delivery groups, their hosts and the sessions placed on them. Written in
-- the SQL both SQLite and PostgreSQL accept, so one file migrates either.

CREATE TABLE delivery_groups (
    name          TEXT PRIMARY KEY,
    kind          TEXT NOT NULL CHECK (kind IN ('pooled', 'personal')),
    spread        TEXT NOT NULL CHECK (spread IN ('breadth', 'depth')),
    description   TEXT NOT NULL DEFAULT ''
);

-- sessions and pending are counters kept in the host row so that one
-- statement can check and reserve a slot under the row's lock; pending
-- counts launches that have not logged on yet (the logon tolerance).
CREATE TABLE hosts (
    name          TEXT PRIMARY KEY,
    group_name    TEXT NOT NULL REFERENCES delivery_groups (name),
    zone          TEXT NOT NULL DEFAULT '',
    address       TEXT NOT NULL,
    port          INTEGER NOT NULL,
    weight        DOUBLE PRECISION NOT NULL DEFAULT 1,
    session_limit INTEGER NOT NULL,
    logon_limit   INTEGER NOT NULL,
    sessions      INTEGER NOT NULL DEFAULT 0,
    pending       INTEGER NOT NULL DEFAULT 0,
    cpu           DOUBLE PRECISION NOT NULL DEFAULT 0,
    mem           DOUBLE PRECISION NOT NULL DEFAULT 0,
    disk_idle     DOUBLE PRECISION NOT NULL DEFAULT 1,
    disk_latency  DOUBLE PRECISION NOT NULL DEFAULT 0,
    mem_pressure  DOUBLE PRECISION NOT NULL DEFAULT 0,
    -- why the host takes no new sessions; empty when healthy
    unhealthy     TEXT NOT NULL DEFAULT '',
    admin_drain   BOOLEAN NOT NULL DEFAULT FALSE,
    agent_drain   BOOLEAN NOT NULL DEFAULT FALSE,
    assigned_user TEXT,
    registered_at BIGINT NOT NULL,
    last_seen     BIGINT NOT NULL
);
CREATE INDEX hosts_group ON hosts (group_name);
-- a personal desktop belongs to one user
CREATE UNIQUE INDEX hosts_assigned ON hosts (group_name, assigned_user) WHERE assigned_user IS NOT NULL;

CREATE TABLE sessions (
    id            TEXT PRIMARY KEY,
    user_name     TEXT NOT NULL,
    group_name    TEXT NOT NULL,
    host_name     TEXT NOT NULL REFERENCES hosts (name),
    state         TEXT NOT NULL CHECK (state IN ('launching', 'active', 'disconnected', 'ended')),
    created_at    BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL,
    logon_at      BIGINT,
    ended_at      BIGINT
);
-- one live session per user and delivery group: a second launch reconnects
CREATE UNIQUE INDEX sessions_live ON sessions (user_name, group_name) WHERE state <> 'ended';
CREATE INDEX sessions_host ON sessions (host_name) WHERE state <> 'ended';
