-- Who may launch a delivery group, as an administrator set it through the
-- admin API (the console's delivery groups page): it replaces the group's
-- configured users and groups until it is cleared. The lists are JSON
-- arrays of names.
CREATE TABLE entitlements (
    group_name  TEXT PRIMARY KEY REFERENCES delivery_groups (name),
    users       TEXT NOT NULL,
    user_groups TEXT NOT NULL,
    set_by      TEXT NOT NULL,
    set_at      BIGINT NOT NULL
);
