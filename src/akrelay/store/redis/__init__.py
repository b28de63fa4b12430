"""The Redis backend of the store: the log (``store``), the shared client and its outage kinds
(``client``), the reconciliation set (``recon``), the node-local trigram index (``text``), and the Lua
scripts they run (``*.lua``, package data)."""
