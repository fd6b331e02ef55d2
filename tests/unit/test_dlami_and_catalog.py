"""What the tool offers and boots: p3 (V100) retired with why, and the PyTorch DLAMI found by name
where listing the SSM parameters is refused, newer releases than the shipped list included."""
import boto3
import pytest
from botocore.stub import Stubber

from ec2gpu.aws import catalog, images
from ec2gpu.errors import RetiredInstanceType
from ec2gpu.tasks import resolve


@pytest.mark.parametrize(("itype", "instead"), [("p3.2xlarge", "g5.xlarge"), ("p3.8xlarge", "g5.12xlarge"),
                                                ("p3.16xlarge", "g5.48xlarge")])
def test_p3_is_retired_saying_why_and_what_to_use(itype, instead):
    with pytest.raises(RetiredInstanceType) as err:
        catalog.lookup(itype)
    assert "V100" in err.value.message and "sm_70" in err.value.message and "DLAMI" in err.value.message
    assert err.value.hint == f"use --instance-type {instead}" and instead in catalog.CATALOG
    assert catalog.RETIRED_LAST_PRICE[itype] > 0
    assert not [t for t in catalog.CATALOG.values() if t.gpu == "V100"]


def test_a_task_asking_for_v100_is_told_why_and_what_to_ask_for():
    with pytest.raises(RetiredInstanceType) as err:
        resolve.instance_type_for_gpu("V100:4")
    assert "V100 GPUs are on p3 instances only" in err.value.message and err.value.hint == "ask for gpu: A10G:4 instead"
    assert resolve.instance_type_for_gpu("T4") == "g4dn.xlarge"


def test_where_listing_parameters_is_refused_the_newest_dlami_is_still_found_by_name():
    """GetParametersByPath refused: the shipped names are tried newest first, and past the newest
    shipped one that answers, the next releases until one is missing (here 2.12; 2.13 and 3.0 are not)."""
    ssm = boto3.client("ssm", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    newest = images.SSM_PARAMETERS[0]
    assert newest == images.parameter_name(images.FALLBACK_TORCH[0], "24.04")
    with Stubber(ssm) as stub:
        stub.add_client_error("get_parameters_by_path", "AccessDeniedException")
        stub.add_response("get_parameter", {"Parameter": {"Name": newest, "Value": "ami-shipped"}}, {"Name": newest})
        later = images.parameter_name("2.12", "24.04")
        stub.add_response("get_parameter", {"Parameter": {"Name": later, "Value": "ami-later"}}, {"Name": later})
        for missing in ("2.13", "3.0"):
            stub.add_client_error("get_parameter", "ParameterNotFound",
                                  expected_params={"Name": images.parameter_name(missing, "24.04")})
        params = images._by_path(ssm)
        assert params is None and images._by_name(ssm) == (later, "ami-later", "24.04")
        stub.assert_no_pending_responses()
