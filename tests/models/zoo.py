"""The model zoo: small random-init Hugging Face and timm models, with their inputs and training loss.

Each `ModelSpec` builds its model on the CPU from a small config (nothing is downloaded), makes a
batch of inputs, and says how a training step turns the model's output into a scalar loss. Dropout
is configured to 0 so that a tpu run and a CPU run compute the same function (their random streams
differ, as CUDA's and CPU's do). Sizes are small enough that a forward, backward and three AdamW
steps run in seconds on two cores; the architectures (attention variants, MoE routing, convolutions,
normalisations, windowed attention) are the real ones.
"""
import dataclasses
from typing import Callable

import torch


VOCAB = 128
SEQ = 16
BATCH = 2


@dataclasses.dataclass
class ModelSpec:
    """A zoo entry. `build()` -> nn.Module on the CPU; `inputs(gen)` -> dict of CPU tensors (keyword
    arguments of forward); `loss(output, inputs)` -> scalar tensor; `generate` marks causal LMs whose
    Hugging Face `generate()` is also checked."""
    name: str
    family: str  # "transformers" or "timm"
    build: Callable
    inputs: Callable
    loss: Callable
    generate: bool = False


def _tokens(gen, shape=(BATCH, SEQ)):
    return torch.randint(0, VOCAB, shape, generator=gen)


def _hf_loss(model, inputs):
    return model(**inputs).loss


def _lm_inputs(gen):
    ids = _tokens(gen)
    return {"input_ids": ids, "labels": ids.clone()}


def _image_inputs(gen, size=32, classes=10):
    return {"pixel_values": torch.randn(BATCH, 3, size, size, generator=gen),
            "labels": torch.randint(0, classes, (BATCH,), generator=gen)}


def _small_decoder(config_cls, **extra):
    # The Llama-family knobs shared by Llama, Mistral and Mixtral: 2 layers, grouped-query attention.
    return config_cls(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      attention_dropout=0.0, **extra)


def _gpt2():
    import transformers as tf
    return tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=2,
                                            n_head=4, bos_token_id=1, eos_token_id=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def _bert():
    import transformers as tf
    return tf.BertForMaskedLM(tf.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                            num_attention_heads=4, intermediate_size=128,
                                            max_position_embeddings=64, hidden_dropout_prob=0.0,
                                            attention_probs_dropout_prob=0.0))


def _llama():
    import transformers as tf
    return tf.LlamaForCausalLM(_small_decoder(tf.LlamaConfig))


def _mistral():
    import transformers as tf
    return tf.MistralForCausalLM(_small_decoder(tf.MistralConfig, sliding_window=8))


def _mixtral():
    import transformers as tf
    return tf.MixtralForCausalLM(_small_decoder(tf.MixtralConfig, num_local_experts=4,
                                                num_experts_per_tok=2, router_aux_loss_coef=0.01,
                                                output_router_logits=True))


def _t5():
    import transformers as tf
    return tf.T5ForConditionalGeneration(tf.T5Config(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128,
                                                     num_layers=2, num_heads=4, dropout_rate=0.0,
                                                     decoder_start_token_id=0))


def _t5_inputs(gen):
    return {"input_ids": _tokens(gen), "labels": _tokens(gen, (BATCH, SEQ // 2))}


def _vit():
    import transformers as tf
    return tf.ViTForImageClassification(tf.ViTConfig(image_size=32, patch_size=8, hidden_size=64,
                                                     num_hidden_layers=2, num_attention_heads=4,
                                                     intermediate_size=128, num_labels=10,
                                                     hidden_dropout_prob=0.0,
                                                     attention_probs_dropout_prob=0.0))


def _clip():
    import transformers as tf
    text = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, max_position_embeddings=SEQ, attention_dropout=0.0)
    vision = dict(image_size=32, patch_size=8, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, attention_dropout=0.0)
    text.update(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return tf.CLIPModel(tf.CLIPConfig(text_config=text, vision_config=vision, projection_dim=32))


def _clip_inputs(gen):
    return {"input_ids": _tokens(gen), "pixel_values": torch.randn(BATCH, 3, 32, 32, generator=gen),
            "return_loss": True}


def _whisper():
    import transformers as tf
    return tf.WhisperForConditionalGeneration(tf.WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=16, d_model=64, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
        max_source_positions=16, max_target_positions=32, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        decoder_start_token_id=1, suppress_tokens=None, begin_suppress_tokens=None))


def _whisper_inputs(gen):
    # input_features: (batch, mel bins, 2 * max_source_positions): the encoder's convolutions halve it.
    return {"input_features": torch.randn(BATCH, 16, 32, generator=gen),
            "labels": _tokens(gen, (BATCH, SEQ // 2))}


def _timm(name, **kwargs):
    def build():
        import timm
        return timm.create_model(name, pretrained=False, num_classes=10, **kwargs)
    return build


def _timm_inputs(gen, size=32):
    return {"x": torch.randn(BATCH, 3, size, size, generator=gen),
            "labels": torch.randint(0, 10, (BATCH,), generator=gen)}


def _cnn_inputs(gen):
    return _timm_inputs(gen, 64)


def _timm_loss(model, inputs):
    return torch.nn.functional.cross_entropy(model(inputs["x"]), inputs["labels"])


MODELS = [
    ModelSpec("gpt2", "transformers", _gpt2, _lm_inputs, _hf_loss, generate=True),
    ModelSpec("bert", "transformers", _bert, _lm_inputs, _hf_loss),
    ModelSpec("llama", "transformers", _llama, _lm_inputs, _hf_loss, generate=True),
    ModelSpec("mistral", "transformers", _mistral, _lm_inputs, _hf_loss, generate=True),
    ModelSpec("mixtral", "transformers", _mixtral, _lm_inputs, _hf_loss),
    ModelSpec("t5", "transformers", _t5, _t5_inputs, _hf_loss),
    ModelSpec("vit", "transformers", _vit, _image_inputs, _hf_loss),
    ModelSpec("clip", "transformers", _clip, _clip_inputs, _hf_loss),
    ModelSpec("whisper", "transformers", _whisper, _whisper_inputs, _hf_loss),
    # 64x64 for the stride-32 convolutional nets: their last stages then see 2x2 pixels, not one, so
    # batch norm normalises 8 values per channel, not 2 (with 2 it is +-1 by a near-tie's sign, and a
    # rounding difference flips it).
    ModelSpec("resnet18", "timm", _timm("resnet18"), _cnn_inputs, _timm_loss),
    ModelSpec("convnext_atto", "timm", _timm("convnext_atto"), _cnn_inputs, _timm_loss),
    ModelSpec("efficientnet_b0", "timm", _timm("efficientnet_b0"), _cnn_inputs, _timm_loss),
    ModelSpec("vit_tiny", "timm", _timm("vit_tiny_patch16_224", img_size=32, patch_size=8),
              _timm_inputs, _timm_loss),
    ModelSpec("swin_tiny", "timm", _timm("swin_tiny_patch4_window7_224", img_size=32, window_size=4,
                                         embed_dim=32, depths=(1, 1, 2, 1), num_heads=(1, 2, 4, 8)),
              _timm_inputs, _timm_loss),
]

BY_NAME = {m.name: m for m in MODELS}
