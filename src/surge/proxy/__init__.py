"""HTTP ingress: parse (httptools), admit, route, forward over frames, respond."""
