-- Sessions an agent reports that the broker did not place are recorded
-- as unverified: they count against the host's capacity, but a user's
-- next launch is not sent to them (a host could otherwise claim any user).
ALTER TABLE sessions ADD COLUMN verified BOOLEAN NOT NULL DEFAULT TRUE;
DROP INDEX sessions_live;
CREATE UNIQUE INDEX sessions_live ON sessions (user_name, group_name) WHERE state <> 'ended' AND verified;
