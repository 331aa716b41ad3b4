"""The default catalog as a Ray Serve application object, for `serve build` (which needs an
application, not a builder):

    serve build modelyard.scale.default_app:app -o serve_config.yaml

For another catalog or config, point `serve run` / a RayService at the builder instead:
`modelyard.scale.ray_serve:app_builder` with `args: {catalog: FILE, config: FILE}`.
"""

from __future__ import annotations

from modelyard.scale.ray_serve import app_builder

app = app_builder({})
