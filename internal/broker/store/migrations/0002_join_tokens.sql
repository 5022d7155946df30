-- Uses of join tokens that register a limited number of hosts, by token
-- id, so the limit holds across brokers sharing the database.
CREATE TABLE join_token_uses (
    jti           TEXT PRIMARY KEY,
    uses          INTEGER NOT NULL,
    expires_at    BIGINT NOT NULL
);
