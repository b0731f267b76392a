"""The measuring worker `anyshape.compile` starts: one job on standard input and
output (`python -m anyshape._worker`)."""
from anyshape._anyshape import serve_worker

raise SystemExit(serve_worker())
