"""Fixtures and facts shared by the end-to-end scenarios (a real engine, the default model)."""
import os

from tests.conftest import ENGINE_EXE, model_path

ENGINE = os.environ.get("STRATA_TEST_ENGINE", ENGINE_EXE)


MODEL = model_path()


WEATHER = {"name": "get_weather", "description": "Get the current weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                          "required": ["city"]}}
