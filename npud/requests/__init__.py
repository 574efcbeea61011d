"""What npud does for each request, and the client state and objects requests create."""
