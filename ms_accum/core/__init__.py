"""The window: the buffer and its rules, the guard, graph math, in-graph statistics, reducers, losses."""
