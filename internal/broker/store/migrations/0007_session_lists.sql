-- A user's sessions (the portal's desktops page, every launch's check for a
-- session to return to) and the newest sessions (the console's pages) are
-- read by index, however many sessions the table holds.
CREATE INDEX sessions_user ON sessions (user_name, created_at);
CREATE INDEX sessions_created ON sessions (created_at);
