import torch


class Risk(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.embed = torch.nn.Embedding(3, 4)
        self.body = torch.nn.Linear(20, 32)
        self.score = torch.nn.Linear(32, 1)
        self.probs = torch.nn.Linear(32, 3)

    def forward(self, features, category):
        hidden = torch.relu(self.body(torch.cat([features, self.embed(category[:, 0])], dim=1)))
        return self.score(hidden), torch.softmax(self.probs(hidden), dim=1)


def build():
    return Risk()
