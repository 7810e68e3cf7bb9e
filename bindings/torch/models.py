"""The demo models: a linear SVM with log loss (Bottou's SVM-SGD), a small CNN, a wide
MLP (the compute-bound workload of the straggler benchmarks) and a small character-level
transformer language model (the workload of low-communication training, docs/LOWCOMM.md)."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class LogLossSVM(nn.Module):
    """A linear classifier f(x) = w.x + b trained on the log loss log(1 + exp(-y f(x)))
    with L2 regularization on w (through the optimizer's weight decay), as the
    SVM-SGD experiments of the ASAP and Hop papers (Bottou's SVM-SGD, log loss)."""

    def __init__(self, n_features: int):
        super().__init__()
        self.linear = nn.Linear(n_features, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Scores f(x), shape (batch,); x dense or sparse (COO)."""
        if x.is_sparse:
            return torch.sparse.mm(x, self.linear.weight.t()).squeeze(-1) + self.linear.bias
        return self.linear(x).squeeze(-1)

    @staticmethod
    def loss(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean log loss; labels are 0/1 (0 stands for y = -1).  Computed in float32 at
        least (16-bit scores would round the loss and its gradient coarsely)."""
        scores = scores.float() if scores.element_size() < 4 else scores
        return F.binary_cross_entropy_with_logits(scores, labels.to(scores.dtype))

    @staticmethod
    def predict(scores: torch.Tensor) -> torch.Tensor:
        """Class 1 where f(x) > 0."""
        return (scores > 0).long()


class _Classifier(nn.Module):
    """A model that scores each class: cross-entropy loss, the top class predicted."""

    @staticmethod
    def loss(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy, in float32 at least (as for the log loss)."""
        return F.cross_entropy(scores.float() if scores.element_size() < 4 else scores,
                               labels)

    @staticmethod
    def predict(scores: torch.Tensor) -> torch.Tensor:
        """The highest-scoring class."""
        return scores.argmax(-1)


class SmallCNN(_Classifier):
    """Two 3x3 convolutions, a 2x2 max-pool and two dense layers, for 8x8 images."""

    def __init__(self, channels: int = 1, side: int = 8, n_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * (side // 2) ** 2, 64)
        self.fc2 = nn.Linear(64, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class scores, shape (batch, n_classes)."""
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


class WideMLP(_Classifier):
    """Two hidden ReLU layers of `width` units over the flattened example: with 2000
    inputs and width 512, 1.29M parameters (5.2 MB), a dense forward and backward of
    about 8 MFLOP per example, so a step of batch 256 is compute that a slower host
    stretches (a linear model's step is mostly its exchange)."""

    def __init__(self, n_inputs: int, n_classes: int, width: int = 512):
        super().__init__()
        self.hidden1 = nn.Linear(n_inputs, width)
        self.hidden2 = nn.Linear(width, width)
        self.out = nn.Linear(width, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class scores, shape (batch, n_classes)."""
        x = F.relu(self.hidden1(x.flatten(1)))
        return self.out(F.relu(self.hidden2(x)))


class CharTransformer(nn.Module):
    """A decoder-only transformer over bytes: token and learned position embeddings,
    `layers` pre-norm blocks of causal self-attention (`heads` heads) and a GELU MLP of
    4 x `width` (torch's TransformerEncoderLayer with a causal mask), a final LayerNorm
    and the token embedding again as the output layer (tied weights).

    At the defaults of `asapmpi train lm` (vocabulary 256, context 64, width 64, 2
    layers) it has 120k parameters (0.5 MB), small enough that 8 ranks oversubscribed on
    2 cores each take a step of 32 windows in well under a second.  Embeddings start at
    N(0, 0.02) (GPT-2's), so the first scores are near zero and the loss near
    ln(vocabulary)."""

    def __init__(self, vocabulary: int = 256, context: int = 64, width: int = 64,
                 layers: int = 2, heads: int = 4):
        super().__init__()
        self.context = context
        self.embed = nn.Embedding(vocabulary, width)
        self.position = nn.Embedding(context, width)
        block = nn.TransformerEncoderLayer(width, heads, dim_feedforward=4 * width,
                                           dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        # the nested-tensor path is for padding masks, and warns with norm_first
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        for table in (self.embed, self.position):
            nn.init.normal_(table.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Scores of the next byte at every position, shape (batch, length, vocabulary),
        for x of byte values, shape (batch, length), length <= context."""
        length = x.shape[1]
        h = self.embed(x) + self.position.weight[:length]
        # made per call, not a buffer: a buffer would be exchanged with the parameters
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=h.device,
                                                              dtype=h.dtype)
        h = self.blocks(h, mask=mask, is_causal=True)
        return self.norm(h) @ self.embed.weight.t()

    @staticmethod
    def loss(scores: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy per predicted byte (nats), in float32 at least."""
        scores = scores.float() if scores.element_size() < 4 else scores
        return F.cross_entropy(scores.flatten(0, 1), targets.flatten())


def build(kind: str, shape, n_classes: int, width: int = 512, layers: int = 2,
          heads: int = 4) -> nn.Module:
    """The demo model for `kind` ("svm", "cnn", "mlp" or "lm") and one example's `shape`
    (`width`: the MLP's hidden units, the language model's embedding width; `layers`
    and `heads`: the language model's; for "lm" `shape` is (context,) and `n_classes`
    the vocabulary)."""
    if kind == "svm":
        if n_classes != 2:
            raise ValueError("the SVM demo is binary")
        return LogLossSVM(int(shape[-1]) if len(shape) == 1 else int(torch.tensor(shape).prod()))
    if kind == "cnn":
        return SmallCNN(int(shape[0]), int(shape[-1]), n_classes)
    if kind == "mlp":
        return WideMLP(int(torch.tensor(shape).prod()), n_classes, width)
    if kind == "lm":
        return CharTransformer(n_classes, int(shape[0]), width, layers, heads)
    raise ValueError(f"unknown model {kind!r}")
