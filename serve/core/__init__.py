"""serve.core (floor 1): the one internal request, its values and its errors; imports no other serve floor."""
