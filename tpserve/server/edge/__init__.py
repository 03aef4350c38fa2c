"""The edge: Envoy's configuration and process, the request checks, the recorder, cancelled calls and admission."""
