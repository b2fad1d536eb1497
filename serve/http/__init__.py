"""serve.http (floor 7): the shell: server, one route table, views, socket guard, access, stream pacing, run."""
