-- epoch.lua: learn the current data epoch of this Redis (of this Cluster slot);
-- changes nothing else.
--
-- KEYS: the ten of common.lua; the last ARGV: the epoch (common.lua), the only one.
--
-- Returns {1} to a caller that presents the current epoch (common.lua answers any
-- other with the epoch, as it does for every script).

return {1}
