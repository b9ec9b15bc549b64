from fastapi import APIRouter

router = APIRouter(tags=["models"])
