"""Type stubs of the native module (see `anyshape/__init__.py` for the API to use)."""
from typing import List, Optional, Tuple, Union

import numpy as np

__version__: str

class AnyshapeError(Exception): ...
class InvalidArgument(ValueError): ...
class ModuleError(AnyshapeError): ...
class CompileError(AnyshapeError): ...

_Info = Tuple[str, str, List[Union[int, str]]]

class Model:
    def __init__(self, path: str) -> None: ...
    def inputs(self) -> List[_Info]: ...
    def outputs(self) -> List[_Info]: ...
    def dims(self) -> List[Tuple[str, int, int]]: ...
    def run(self, arrays: List[np.ndarray], out: Optional[List[Optional[np.ndarray]]] = None) -> List[np.ndarray]: ...
    def generate(
        self,
        prompt: np.ndarray,
        max_new_tokens: int,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        seed: int = 0,
        stop_token: Optional[int] = None,
    ) -> Tuple[List[List[int]], List[float]]: ...

def compile(
    model: str,
    dims: List[str],
    out: str,
    trials: int,
    records: Optional[str],
    resume: bool,
    cache: Optional[str],
    python: str,
    progress: bool,
    precision: str,
    db: Optional[str],
    use_db: bool,
    queue: Optional[str],
    search: str,
    winograd: bool,
) -> str: ...
def serve_worker() -> int: ...
