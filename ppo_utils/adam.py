"""Adam as torch.optim.Adam computes it, without the second that torch.optim.Optimizer adds to each
start (1.1 s, docs/ppo.md): its methods import torch._dynamo, which only --compile uses.
`Adam` keeps the moments itself and calls torch.optim.adam.adam, the function torch.optim.Adam.step
calls, with the same arguments: the same numbers, bit for bit, and the same state_dict layout, so
either class loads what the other saved.
"""

import torch
from torch.optim.adam import adam


class Adam:
    """torch.optim.Adam(params, lr=lr, eps=eps, fused=fused), one parameter group, whose "lr" the
    scripts anneal between steps."""

    def __init__(self, params, lr: float, eps: float = 1e-8, fused: bool | None = None):
        self.params = list(params)
        self.param_groups = [{
            "lr": lr, "betas": (0.9, 0.999), "eps": eps, "weight_decay": 0, "amsgrad": False,
            "maximize": False, "foreach": None, "capturable": False, "differentiable": False,
            "fused": fused, "decoupled_weight_decay": False, "params": self.params}]
        # per parameter, from its first step: the step count and the two moving averages
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    def zero_grad(self) -> None:
        for param in self.params:
            param.grad = None

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        params = [param for param in self.params if param.grad is not None]
        for param in params:
            if param not in self.state:
                self.state[param] = {
                    # kept on the parameter's device by the fused kernel, on the CPU otherwise
                    "step": (torch.zeros((), dtype=torch.float32, device=param.device)
                             if group["capturable"] or group["fused"] else torch.tensor(0.0)),
                    "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format)}
        states = [self.state[param] for param in params]
        beta1, beta2 = group["betas"]
        # every argument but decoupled_weight_decay, which torch 2.6 (the floor) lacks: its
        # default, False, changes nothing without weight decay
        adam(params, [param.grad for param in params], [state["exp_avg"] for state in states],
             [state["exp_avg_sq"] for state in states], [], [state["step"] for state in states],
             amsgrad=group["amsgrad"], has_complex=False, beta1=beta1, beta2=beta2, lr=group["lr"],
             weight_decay=group["weight_decay"], eps=group["eps"], maximize=group["maximize"],
             foreach=group["foreach"], capturable=group["capturable"],
             differentiable=group["differentiable"], fused=group["fused"])

    def state_dict(self) -> dict:
        position = {param: i for i, param in enumerate(self.params)}
        settings = {key: value for key, value in self.param_groups[0].items() if key != "params"}
        return {"state": {position[param]: state for param, state in self.state.items()},
                "param_groups": [{**settings, "params": list(range(len(self.params)))}]}

    def load_state_dict(self, state_dict: dict) -> None:
        """Settings and state as either class saved them, on the parameters' devices."""
        (saved_group,) = state_dict["param_groups"]
        if len(saved_group["params"]) != len(self.params):
            raise ValueError(f"the saved optimizer holds {len(saved_group['params'])} parameters, "
                             f"this one {len(self.params)}")
        group = self.param_groups[0]
        group.update({key: value for key, value in saved_group.items() if key != "params"})
        param_of = dict(zip(saved_group["params"], self.params))
        self.state = {}
        for index, saved in state_dict["state"].items():
            param = param_of[index]
            step = saved["step"]
            if group["capturable"] or group["fused"]:  # the fused kernel reads it on the device
                step = step.to(dtype=torch.float32, device=param.device)
            self.state[param] = {"step": step, **{
                key: value.to(dtype=param.dtype, device=param.device)
                for key, value in saved.items() if key != "step"}}
