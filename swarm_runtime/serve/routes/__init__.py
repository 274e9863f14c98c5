"""The gateway's HTTP routes, one module per resource: :mod:`.health` (probes, health, metrics),
:mod:`.agents` (the population), :mod:`.swap` (live version swap and rollback), :mod:`.episodes` (episodes: start, list, state, cancel) and :mod:`.turns` (a
client-side episode's turns). Each handler reads the gateway's state as ``request.app.state.gateway``
(:class:`swarm_runtime.serve.state.Gateway`)."""
