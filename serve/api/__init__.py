"""serve.api (floor 6): one translator per dialect over the one internal request and a neutral `wire` module."""
