-- Each join of a host gets an id that its agent's credentials carry, so
-- that a credential of a host an administrator removed is refused by the
-- host registered under the same name afterwards. Hosts from before have
-- none, as have their credentials, until they are removed and join again.
ALTER TABLE hosts ADD COLUMN registration TEXT NOT NULL DEFAULT '';
