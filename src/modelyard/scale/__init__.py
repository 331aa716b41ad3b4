"""Ray Serve mode: the catalog as a Ray Serve application (`modelyard serve --ray`).

- `ray_serve.py`: the app builder (`build_ray_app`, `app_builder` for `serve run`), the ingress
  deployment and `serve_on_ray` for the CLI;
- `replicas.py`: what runs in the LLM replicas (one engine worker each) and in the multiplexed
  pool of the other models;
- `provider.py`: the ingress's ModelProvider over deployment handles; `llm_client.py` its engine
  client of an LLM deployment (LoRA adapters, pinned prefixes through `pins.py`); `calls.py`
  the per-request context of the calls and Ray's errors mapped to the routes' errors;
- `affinity.py` + `ray_router.py`: prefix-aware replica choice on Serve's request-router
  extension point;
- `config.py`: the config file's `ray:` section.

Only `modelyard serve --ray` imports these modules; single-node serving never imports Ray.
"""
