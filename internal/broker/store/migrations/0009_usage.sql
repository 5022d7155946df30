-- What hosts and sessions use, as the agents last reported it: per host
-- its major page faults and swap activity (pages per second) and the
-- average memory (Pss) of its sessions; per session its memory and the
-- share of one core it used. Hosts and sessions from before read as 0,
-- as do those of agents that do not report them.
ALTER TABLE hosts ADD COLUMN major_faults DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE hosts ADD COLUMN swap_in DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE hosts ADD COLUMN swap_out DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE hosts ADD COLUMN session_memory BIGINT NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN memory_bytes BIGINT NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN cpu DOUBLE PRECISION NOT NULL DEFAULT 0;
