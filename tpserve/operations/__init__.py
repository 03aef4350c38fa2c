"""Operations that use both the server's files and its API: rolling a new build into a running server."""
