"""Sentence encoders of known geometry with random weights, for `SPEC=examples/text/models.toml`.

A factory returns transformers' BertModel: token ids and attention mask in, token embeddings out. The spec's
`pooling = "mean"` adds mean pooling and L2 normalization inside the exported program, so the served model
answers one normalized embedding per sentence. Load trained weights with `checkpoint = "..."`.
"""


def bert(hidden: int = 384, layers: int = 6, heads: int = 12, intermediate: int = 1536, seed: int = 0):
    """A BertModel with random weights: MiniLM-L6 geometry by default (hidden 384, 6 layers, 12 heads)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=30522,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=intermediate,
        max_position_embeddings=512,
    )
    return transformers.BertModel(config, add_pooling_layer=False).eval()
