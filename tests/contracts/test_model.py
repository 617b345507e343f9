

def test_statuses_read_as_the_seeds_name_them_and_active_is_running_in_the_api():
    from contracts.labels import status_label
    from contracts.model import JobStatus, api_status

    assert status_label(api_status(JobStatus.ACTIVE)) == "Active"
    for status in JobStatus:
        assert status_label(api_status(status)) == status.value.capitalize()
    assert status_label("") == "Unknown"
