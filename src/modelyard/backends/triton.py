"""Triton backend: a client of a remote Triton Inference Server (tritonclient.http).

The remote model is loaded explicitly when the manager loads this model (`load()` ->
`load_model`) and unloaded explicitly when the manager evicts or unloads it (`close()` ->
`unload_model`) — never from `__del__`. Input/output names and datatypes come from the remote
model's metadata. Options: `url` (host:port, required), `model_name` (default: the source),
`model_version` (default ""), `timeout_s` (connection and network timeout, default 30),
`unload_on_close` (default true).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from modelyard.backends.base import Output
from modelyard.backends.options import TritonOptions, options_of
from modelyard.backends.tensors import DATATYPES, from_numpy, to_numpy
from modelyard.model_spec import ModelSpec


class TritonBackend:
    def __init__(self, spec: ModelSpec) -> None:
        options = options_of(spec, TritonOptions)
        self.spec = spec
        self.url = options.url
        self.model_name = options.model_name or spec.source
        self.model_version = options.model_version
        self.timeout_s = options.timeout_s
        self.unload_on_close = options.unload_on_close
        self._client: Any = None
        self._metadata: dict[str, Any] = {}

    def load(self) -> None:
        import tritonclient.http as httpclient

        self._client = httpclient.InferenceServerClient(
            self.url, connection_timeout=self.timeout_s, network_timeout=self.timeout_s
        )
        self._client.load_model(self.model_name)
        deadline = time.monotonic() + self.timeout_s
        while not self._client.is_model_ready(self.model_name, self.model_version):
            if time.monotonic() > deadline:
                raise TimeoutError(f"triton model {self.model_name} not ready in time")
            time.sleep(0.05)
        self._metadata = self._client.get_model_metadata(self.model_name, self.model_version)

    def preprocess(self, item: Any, options: dict[str, Any]) -> Any:
        inputs = {i["name"]: i for i in self._metadata.get("inputs", [])}
        if not isinstance(item, dict) or set(item) != set(inputs):
            raise ValueError(f"inputs must be exactly {sorted(inputs)}")
        arrays = {}
        for name, tensor in item.items():
            array = to_numpy(tensor)
            datatype = inputs[name]["datatype"]
            arrays[name] = array.astype(DATATYPES[datatype]) if datatype in DATATYPES else array
        return arrays

    def infer(self, items: Sequence[Any], options: dict[str, Any]) -> list[Output]:
        import tritonclient.http as httpclient

        outputs = [o["name"] for o in self._metadata.get("outputs", [])]
        inputs_meta = {i["name"]: i["datatype"] for i in self._metadata.get("inputs", [])}
        results: list[Output] = []
        for arrays in items:
            infer_inputs = []
            for name, array in arrays.items():
                infer_input = httpclient.InferInput(name, list(array.shape), inputs_meta[name])
                infer_input.set_data_from_numpy(array, binary_data=True)
                infer_inputs.append(infer_input)
            requested = [httpclient.InferRequestedOutput(n, binary_data=True) for n in outputs]
            answer = self._client.infer(
                self.model_name,
                infer_inputs,
                model_version=self.model_version,
                outputs=requested,
                timeout=int(self.timeout_s * 1_000_000),
            )
            results.append({n: from_numpy(np.asarray(answer.as_numpy(n))) for n in outputs})
        return results

    def metadata(self) -> dict[str, Any]:
        return {
            "inputs": [
                {"name": i["name"], "datatype": i["datatype"], "shape": i["shape"]}
                for i in self._metadata.get("inputs", [])
            ],
            "outputs": [
                {"name": o["name"], "datatype": o["datatype"], "shape": o["shape"]}
                for o in self._metadata.get("outputs", [])
            ],
        }

    def close(self) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        try:
            if self.unload_on_close:
                client.unload_model(self.model_name)
        finally:
            client.close()
