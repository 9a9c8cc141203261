"""What the fleet keeps outside a message, for both sides: every Redis key and Lua script
(``keys``), the one way to open a Redis client on a fleet URL (``broker``), the job registry and
its flags (``control``), the durable job and cost ledger (``ledger``) and the worker processes'
readiness files (``readiness``)."""
