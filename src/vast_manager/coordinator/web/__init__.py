"""The web face: the app factory, the agent and operator APIs, auth, the dashboard,
/metrics, static files and the server that runs them."""
