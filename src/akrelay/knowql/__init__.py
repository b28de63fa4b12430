"""KnowQL 0.1.0 over the relay's knowledge: ``POST /query`` and its companions.

One module per concept: :mod:`.request` (parsing and validation of a Query
Document), :mod:`.contexts` (the context registry), :mod:`.store` (sessions,
queries and their events, shared by every worker), :mod:`.retrieval` (one
snapshot of the search index and the KIP nexus), :mod:`.compose` (the
extractive composer, the retrieval envelope and the shape binder),
:mod:`.llm` (the optional chat-completions composer), :mod:`.models` (the
model catalog), :mod:`.runner` (one turn, start to end), :mod:`.sse` (event
framing) and :mod:`.engine` (the operations the HTTP routes call).
"""

VERSION = "0.1.0"
#: ``X-Pinecone-Api-Version`` values served; the first is the default.
API_VERSIONS = ("2026-07", "unstable")
VERSION_HEADER = "X-Pinecone-Api-Version"
