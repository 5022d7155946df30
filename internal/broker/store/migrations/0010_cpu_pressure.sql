-- CPU pressure as the agents last reported it: the share of time at
-- least one runnable task waited for a CPU (PSI cpu "some" avg10, 0..1),
-- a health threshold beside memory pressure. Hosts from before, and
-- those of agents that do not report it, read as 0.
ALTER TABLE hosts ADD COLUMN cpu_pressure DOUBLE PRECISION NOT NULL DEFAULT 0;
